"""Kernel slab caches from /proc/slabinfo (what slabtop shows). Reading it needs root."""

from __future__ import annotations

import os
from pathlib import Path

from ._parse import Fact, read_text

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class SlabCache(Fact):
    name: str
    active_objs: int
    num_objs: int
    objsize: int
    pages_per_slab: int
    num_slabs: int

    @property
    def size_bytes(self) -> int:
        """Memory the cache holds in whole slabs: num_slabs x pages per slab x page size."""
        return self.num_slabs * self.pages_per_slab * PAGE_SIZE


def parse_slabinfo(text: str) -> list[SlabCache]:
    caches = []
    for line in text.splitlines():
        if line.startswith(("slabinfo", "#")):
            continue
        head, _, rest = line.partition(":")
        parts = head.split()
        slabdata = rest.split("slabdata")[-1].split() if "slabdata" in rest else []
        if len(parts) < 6 or len(slabdata) < 2:
            continue
        try:
            caches.append(
                SlabCache(
                    name=parts[0],
                    active_objs=int(parts[1]),
                    num_objs=int(parts[2]),
                    objsize=int(parts[3]),
                    pages_per_slab=int(parts[5]),
                    num_slabs=int(slabdata[1]),
                )
            )
        except ValueError:
            continue
    return caches


def read_slabinfo(root: Path = Path("/proc")) -> list[SlabCache] | None:
    """None when /proc/slabinfo is missing or not readable (non-root)."""
    text = read_text(root / "slabinfo")
    return parse_slabinfo(text) if text is not None else None
