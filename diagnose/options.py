"""Validating argparse types for numeric options, in one place: a value that is not a finite
number in its range is a usage error (one line, exit 2) before anything runs."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number(
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: bool = False,
    integer: bool = False,
    unit: str = "",
) -> Callable[[str], float]:
    """An argparse type: a finite number >= minimum (> minimum with above) and <= maximum.
    integer: whole numbers only (returned as int). unit names what the number counts, for the message."""

    def described() -> str:
        parts = []
        if minimum is not None:
            parts.append(f"{'more than' if above else 'at least'} {minimum:g}")
        if maximum is not None:
            parts.append(f"at most {maximum:g}")
        kind = "a whole number" if integer else "a finite number"
        return kind + (" " + " and ".join(parts) if parts else "") + (f" {unit}" if unit else "")

    def parse(text: str) -> float:
        try:
            value: float = int(text, 10) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {described()}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {described()}")
        too_low = minimum is not None and (value <= minimum if above else value < minimum)
        if too_low or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"{text!r} is not {described()}")
        return value

    parse.__name__ = "number"  # argparse names the type in some messages
    return parse


# The options several commands share, so each is checked the same way everywhere.
SECONDS = number(0, above=True, unit="seconds")
INTERVAL = number(0.01, unit="seconds")  # below 10 ms, reading /proc is all memdiag would do
PERCENT = number(0, 100, above=True, unit="percent")
MILLISECONDS = number(0, unit="milliseconds")
PID = number(1, integer=True)
COUNT = number(1, integer=True)
