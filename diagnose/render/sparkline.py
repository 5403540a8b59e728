"""A one-line chart of a series, in Unicode block characters."""

from __future__ import annotations

_BLOCKS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 40) -> str:
    if not values:
        return ""
    if len(values) > width:  # resample to width points, keeping the last
        step = (len(values) - 1) / (width - 1)
        values = [values[round(i * step)] for i in range(width)]
    low, high = min(values), max(values)
    if high == low:
        return _BLOCKS[0] * len(values)
    scale = (len(_BLOCKS) - 1) / (high - low)
    return "".join(_BLOCKS[round((v - low) * scale)] for v in values)
