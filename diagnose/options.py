"""Options several commands share, declared in one place: validating argparse types for numeric
options (a value that is not a finite number in its range is a usage error, one line, exit 2,
before anything runs) and the --playbook option."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from memdiag.system.units import parse_duration, parse_size


def _shown(x: float) -> str:
    """A bound as written in the message: whole numbers in full (4294967295, not 4.29497e+09)."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _quoted(text: str) -> str:
    """The value as given, for the message (a 5000-digit number shown by its first 40)."""
    return repr(text) if len(text) <= 40 else repr(text[:40]) + "..."


def number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: bool = False,
    integer: bool = False,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse type: a finite number >= minimum (> minimum with above) and <= maximum.
    integer: whole numbers only (returned as int). unit names what the number counts, for the
    message; "seconds" and "milliseconds" also take a duration as operators type it ('90s', '5m',
    '2h30m', '1d': system/units.parse_duration), "percent" a trailing '%' ('2%')."""

    def described() -> str:
        parts = []
        if minimum is not None:
            parts.append(f"{'more than' if above else 'at least'} {_shown(minimum)}")
        if maximum is not None:
            parts.append(f"at most {_shown(maximum)}")
        kind = "a whole number" if integer else "a finite number"
        examples = {
            "seconds": " (or a duration: 90s, 5m, 2h30m, 1d)",
            "milliseconds": " (or a duration: 250ms, 2s)",
            "percent": " (e.g. 2 or 2%)",
        }
        return (
            kind + (" " + " and ".join(parts) if parts else "") + (f" {unit}" if unit else "") + examples.get(unit, "")
        )

    def parse(text: str) -> float:
        written = text.strip()
        if unit == "percent" and written.endswith("%"):
            written = written[:-1].rstrip()
        try:
            value: float = int(written, 10) if integer else float(written)
        except ValueError:  # also a whole number of more digits than Python converts (4300)
            value = _duration(written, unit)  # type: ignore[assignment]
            if value is None:
                raise argparse.ArgumentTypeError(f"{_quoted(text)} is not {described()}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not {described()}")
        too_low = minimum is not None and (value <= minimum if above else value < minimum)
        if too_low or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not {described()}")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


def _duration(text: str, unit: str) -> float | None:
    """A duration with its units ('90s', '5m', '2h30m', '1d') in the option's unit (seconds or
    milliseconds); None when the option takes no duration or the text is not one."""
    scale = {"seconds": 1.0, "milliseconds": 1000.0}.get(unit)
    if scale is None or len(text) > 64:
        return None
    try:
        return parse_duration(text) * scale
    except ValueError:
        return None


def size(maximum: int) -> Callable[[str], int]:
    """An argparse type: a size in bytes ('4096', '64KiB', '1.5GiB') of at most maximum."""

    def parse(text: str) -> int:
        try:
            value = parse_size(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if value > maximum:
            pib = f"{maximum / 2**50:g} PiB"
            raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a size of at most {maximum} bytes ({pib})")
        return value

    parse.__name__ = "size"
    return parse


def _function(text: str) -> str:
    """An argparse type: a function's name as its symbol table spells it (C, or a mangled C++ name)."""
    name = text.strip()
    if not name or any(c.isspace() for c in name) or len(name) > 4096:
        raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a function's name (its symbol, e.g. leak_records)")
    return name


def _pattern(text: str) -> str:
    """An argparse type: a place shared memory is made in, as memdiag names it (/dev/shm/job-*.spool)."""
    if not text or len(text) > 4096 or "\0" in text:
        raise argparse.ArgumentTypeError(f"{_quoted(text)} is not a place's pattern (e.g. /dev/shm/job-*.spool)")
    return text


# Bounds. A diagnosis or a probe watches for at most a day (serve's diagnoses for at most an hour);
# a pid is at most the kernel's PID_MAX_LIMIT (4M); memleak's sampling draws a 32-bit random number
# (bpf_get_prandom_u32() % N); no allocation is bigger than the largest user address space of a
# 64-bit Linux (57-bit, 128 PiB), which also keeps every size a plain 64-bit literal in the BPF source.
MAX_SECONDS = 86_400
PID_MAX_LIMIT = 4_194_304
MAX_SAMPLE_EVERY = 2**32 - 1
MAX_BYTES = 2**57
MAX_ROWS = 100_000

# The options several commands share, so each is checked the same way everywhere.
DURATION = number(0, MAX_SECONDS, above=True, unit="seconds")
INTERVAL = number(0.01, MAX_SECONDS, unit="seconds")  # below 10 ms, reading /proc is all memdiag would do
PERCENT = number(0, 100, above=True, unit="percent")
MILLISECONDS = number(0, MAX_SECONDS * 1000, unit="milliseconds")
PID = number(1, PID_MAX_LIMIT, integer=True)
ROWS = number(1, MAX_ROWS, integer=True)  # lines or stacks to show
SAMPLE_EVERY = number(1, MAX_SAMPLE_EVERY, integer=True)
SIZE = size(MAX_BYTES)
FUNCTION = _function
PATTERN = _pattern


def add_playbook_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--playbook",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="also load this rule file (or folder of *.yaml), root-owned and not group/world-writable; repeatable",
    )
