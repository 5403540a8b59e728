"""Units, one home: quantities as a user writes them (command-line sizes, rule literals) parsed by
one parser, and figures formatted for reports and the terminal by one set of formatters.

Sizes: B, KiB/MiB/GiB/TiB (and k/g/t for them), kB/MB/GB/TB (powers of 1000). Durations: ms, s,
min, h, d. Rates: a size or a count per s/min/h. A bare `m` is refused everywhere: it read as
mebibytes where the rule docs promised minutes (`5m`), so a user writes `5min` or `5MiB`."""

from __future__ import annotations

import math
import re
from typing import Literal

from .visible import one_line


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "unknown"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{sign}{value:.1f} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
    return f"{sign}{n:.0f} B"


def fmt_rate(bytes_per_s: float | None) -> str:
    """Memory growth reads best per minute (leaks are slow; a per-second figure hides them)."""
    if bytes_per_s is None:
        return "unknown"
    return f"{fmt_bytes(bytes_per_s * 60)}/min"


def fmt_mib(n: float) -> str:
    """A size in MiB whatever its magnitude, where figures side by side must compare at a glance
    (the reachability scan's amounts)."""
    return f"{n / 2**20:,.1f} MiB"


def fmt_speed(bytes_per_s: float | None) -> str:
    """A read or scan speed, per second (growth is per minute: fmt_rate)."""
    if not bytes_per_s:
        return "an unknown speed"
    if bytes_per_s >= 1 << 30:
        return f"{bytes_per_s / 2**30:.1f} GiB/s"
    return f"{bytes_per_s / 2**20:,.0f} MiB/s"


def fmt_ns(ns: float) -> str:
    """A per-event cost: ns below a microsecond, else µs."""
    return f"{ns / 1000:.1f} µs" if ns >= 1000 else f"{ns:.0f} ns"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    if 0 < seconds < 0.0005:  # a figure that rounds to nothing is still not "0 s"
        return "<1 ms"
    if 0 < seconds < 0.9995:  # a pause or a stall of a fraction of a second is not "0 s"
        return f"{seconds * 1000:.0f} ms"
    if seconds < 9.95:  # 1.36 s is not "1 s": a third of it would vanish in the rounding
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def fmt_number(x: float | None, digits: int = 1) -> str:
    if x is None:
        return "unknown"
    if abs(x) >= 100 or float(x).is_integer():
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


Kind = Literal["bytes", "bytes_per_s", "per_s", "percent", "seconds", "number", "string", "bool"]

_SIZE = {
    "b": 1,
    "kb": 1000,
    "kib": 1 << 10,
    "k": 1 << 10,
    "mb": 1000**2,
    "mib": 1 << 20,
    "gb": 1000**3,
    "gib": 1 << 30,
    "g": 1 << 30,
    "tb": 1000**4,
    "tib": 1 << 40,
    "t": 1 << 40,
}
_TIME = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_NUMBER = r"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_RE = re.compile(rf"^\s*({_NUMBER})\s*([a-zA-Z%]*)\s*(/\s*(?:s|sec|second|m|min|minute|h|hour))?\s*$")
_PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}

KIND_NAMES = {
    "bytes": "a size (e.g. 64MiB)",
    "bytes_per_s": "a rate of bytes (e.g. 1MiB/s)",
    "per_s": "a rate (e.g. 1000/s)",
    "percent": "a percentage (e.g. 5%)",
    "seconds": "a duration (e.g. 30s)",
    "number": "a number",
    "string": "a word",
    "bool": "true or false",
}


def parse_quantity(value: object) -> tuple[float | str | bool, Kind]:
    """A YAML scalar into (value in base units, kind). Raises ValueError with the reason."""
    if isinstance(value, bool):
        return value, "bool"
    if isinstance(value, (int, float)):
        return float(value), "number"
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a quantity")
    m = _RE.match(value)
    if not m:
        return value, "string"
    number, unit, per = float(m.group(1)), m.group(2).lower(), m.group(3)
    divisor = _PER[per.strip("/ ").lower()] if per else None
    if unit == "m":
        n = m.group(1)
        raise ValueError(f"{value!r}: 'm' is ambiguous: write {n}min for a duration or {n}MiB for a size")
    if unit == "%":
        if per:
            raise ValueError(f"{value!r}: a percentage per time is not a unit memdiag knows")
        return number, "percent"
    if unit in _SIZE:
        base = number * _SIZE[unit]
        return (base / divisor, "bytes_per_s") if divisor else (base, "bytes")
    if unit == "" and divisor:
        return number / divisor, "per_s"
    if unit in _TIME and not per:
        return number * _TIME[unit], "seconds"
    if unit == "":
        return number, "number"
    raise ValueError(f"{value!r}: unknown unit {unit!r} (sizes: B KiB MiB GiB; rates: /s; %; durations: ms s min h d)")


# ASCII digits only: Python's \d and float() take any script's digits ('٣٠s'), which no operator
# types and no log or alert carries as a duration
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|min|m|h|d)", re.ASCII)
_PLAIN_SECONDS = re.compile(r"\d+(?:\.\d+)?", re.ASCII)
_DURATION_UNITS = {**_TIME, "m": 60.0}


def parse_duration(text: str) -> float:
    """A duration as an operator types it on the command line, in seconds: a plain number of
    seconds ('30', '1.5') or one or more number-unit parts in the form of Go's, Prometheus's and
    kubectl's ('90s', '5m', '2h30m', '1d', '500ms'; units ms s m min h d). On the command line a
    duration option takes only durations, so 'm' is a minute there (it is refused in rules, where
    a value may be a size too). Raises ValueError with the reason."""
    value = text.strip()
    if _PLAIN_SECONDS.fullmatch(value):  # not float(): it takes 'nan', 'inf', '-5' and '1e3'
        return float(value)
    pos, total = 0, 0.0
    while pos < len(value):
        m = _DURATION_PART.match(value, pos)
        if m is None or (m.end() < len(value) and value[m.end()].isalpha()):
            raise ValueError(f"{text!r} is not a duration (e.g. 90s, 5m, 2h30m, 1d; a plain number is seconds)")
        total += float(m.group(1)) * _DURATION_UNITS[m.group(2)]
        pos = m.end()
    if not value:
        raise ValueError(f"{text!r} is not a duration (e.g. 90s, 5m, 2h30m, 1d; a plain number is seconds)")
    return total


def format_quantity(value: object, kind: Kind) -> str:
    if value is None:
        return "unknown"
    if kind == "bytes":
        return fmt_bytes(value)  # type: ignore[arg-type]
    if kind == "bytes_per_s":
        return fmt_rate(value)  # type: ignore[arg-type]
    if kind == "per_s":
        return f"{fmt_number(value)}/s"  # type: ignore[arg-type]
    if kind == "percent":
        return f"{value:.1f}%"
    if kind == "seconds":
        return fmt_duration(value)  # type: ignore[arg-type]
    if kind == "number":
        return fmt_number(value)  # type: ignore[arg-type]
    return one_line(str(value))  # a string fact may be a target's file or process name: one line


def parse_size(text: str) -> int:
    """'64MiB', '4096', '1.5GiB' -> bytes, by the one quantity parser. ValueError with the reason."""
    example = "(examples: 4096, 64KiB, 1MiB, 2GiB)"
    try:
        value, kind = parse_quantity(text.strip())
    except ValueError as e:
        raise ValueError(f"{e} {example}") from None
    if kind not in ("bytes", "number") or not math.isfinite(value):  # type: ignore[arg-type]
        raise ValueError(f"{text!r} is not a size {example}")
    if value < 0:  # type: ignore[operator]
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value)  # type: ignore[arg-type]
