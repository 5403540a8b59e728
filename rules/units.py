"""Quantities in rule files: sizes (64MiB), rates (1000/s, 1MiB/s), percentages (5%), durations
(30s, 5min), plain numbers, strings and booleans. A bare `m` is refused: it read as mebibytes where
the rule docs promised minutes (`5m`), so a rule says `5min` or `5MiB`. Each literal carries the kind of its unit so a
comparison of a size with a percentage is refused when the rule file is loaded."""

from __future__ import annotations

import re
from typing import Literal

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
_NUMBER = r"[-+]?\d+(?:\.\d+)?"
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


def format_quantity(value: object, kind: Kind) -> str:
    from memdiag.diagnose.units import fmt_bytes, fmt_duration, fmt_number, fmt_rate

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
    return str(value)
