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
    # SLAB_RECLAIM_ACCOUNT (/sys/kernel/slab/NAME/reclaim_account): counted in SReclaimable, shrunk
    # under pressure (dentries, inodes); None: not said (SLAB, or sysfs not read)
    reclaimable: bool | None = None

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


def _reclaimable(sys_root: Path, name: str) -> bool | None:
    flag = read_text(sys_root / "kernel" / "slab" / name / "reclaim_account", 16) if "/" not in name else None
    return flag.strip() == "1" if flag else None


def read_slabinfo(root: Path = Path("/proc"), sys_root: Path = Path("/sys")) -> list[SlabCache] | None:
    """None when /proc/slabinfo is missing or not readable (non-root). Each cache says whether it is
    reclaimable where SLUB's sysfs says so."""
    text = read_text(root / "slabinfo")
    if text is None:
        return None
    return [c.model_copy(update={"reclaimable": _reclaimable(sys_root, c.name)}) for c in parse_slabinfo(text)]
