"""Human units for reports and the terminal: bytes in IEC units, rates, durations."""

from __future__ import annotations

import math


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


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1 << 10,
    "kb": 1000,
    "kib": 1 << 10,
    "m": 1 << 20,
    "mb": 1000**2,
    "mib": 1 << 20,
    "g": 1 << 30,
    "gb": 1000**3,
    "gib": 1 << 30,
    "t": 1 << 40,
    "tb": 1000**4,
    "tib": 1 << 40,
}


def parse_size(text: str) -> int:
    """'64MiB', '1m', '4096', '1.5GiB' -> bytes. ValueError with the reason otherwise."""
    raw = text.strip().lower().replace(" ", "")
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number) :]
    if unit not in _SIZE_UNITS or not number:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64KiB, 1MiB, 2GiB)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64KiB, 1MiB, 2GiB)") from None
    if not math.isfinite(value):  # '1e400' is a float, and inf bytes no size
        raise ValueError(f"{text!r} is not a size (examples: 4096, 64KiB, 1MiB, 2GiB)")
    if value < 0:
        raise ValueError(f"{text!r}: a size cannot be negative")
    return int(value * _SIZE_UNITS[unit])
