"""Swap devices from /proc/swaps."""

from __future__ import annotations

from pathlib import Path

from ._parse import Fact, read_text


class SwapDevice(Fact):
    filename: str
    type: str
    size: int
    used: int
    priority: int


def parse_swaps(text: str) -> list[SwapDevice]:
    devices = []
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 5:
            continue
        try:
            devices.append(
                SwapDevice(
                    # /proc/swaps escapes spaces in the name as \040
                    filename=parts[0].replace("\\040", " "),
                    type=parts[1],
                    size=int(parts[2]) * 1024,
                    used=int(parts[3]) * 1024,
                    priority=int(parts[4]),
                )
            )
        except ValueError:
            continue
    return devices


def read_swaps(root: Path = Path("/proc")) -> list[SwapDevice] | None:
    text = read_text(root / "swaps")
    return parse_swaps(text) if text is not None else None
