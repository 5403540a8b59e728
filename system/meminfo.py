"""System memory from /proc/meminfo: available (not free) memory, caches, anon, slab, swap, commit."""

from __future__ import annotations

from pathlib import Path

from ._parse import Fact, kib_to_bytes, kv_lines, read_text

# model field -> /proc/meminfo key
MEMINFO_KEYS = {
    "mem_total": "MemTotal",
    "mem_free": "MemFree",
    "mem_available": "MemAvailable",
    "buffers": "Buffers",
    "cached": "Cached",
    "anon_pages": "AnonPages",
    "shmem": "Shmem",
    "slab": "Slab",
    "sreclaimable": "SReclaimable",
    "sunreclaim": "SUnreclaim",
    "swap_total": "SwapTotal",
    "swap_free": "SwapFree",
    "committed_as": "Committed_AS",
    "commit_limit": "CommitLimit",
    # the host's ledger (system/ledger.py): the parts MemTotal is made of
    "active_file": "Active(file)",
    "inactive_file": "Inactive(file)",
    "swap_cached": "SwapCached",
    "kernel_stack": "KernelStack",
    "page_tables": "PageTables",
    "sec_page_tables": "SecPageTables",
    "vmalloc_used": "VmallocUsed",
    "percpu": "Percpu",
    "hugetlb": "Hugetlb",
    "zswap": "Zswap",
}


class MemInfo(Fact):
    """Bytes; None where this kernel does not report the field (MemAvailable needs 3.14+)."""

    mem_total: int | None = None
    mem_free: int | None = None
    mem_available: int | None = None
    buffers: int | None = None
    cached: int | None = None
    anon_pages: int | None = None
    shmem: int | None = None
    slab: int | None = None
    sreclaimable: int | None = None
    sunreclaim: int | None = None
    swap_total: int | None = None
    swap_free: int | None = None
    committed_as: int | None = None
    commit_limit: int | None = None
    active_file: int | None = None
    inactive_file: int | None = None
    swap_cached: int | None = None
    kernel_stack: int | None = None
    page_tables: int | None = None
    sec_page_tables: int | None = None
    vmalloc_used: int | None = None
    percpu: int | None = None
    hugetlb: int | None = None
    zswap: int | None = None

    @property
    def swap_used(self) -> int | None:
        if self.swap_total is None or self.swap_free is None:
            return None
        return self.swap_total - self.swap_free

    @property
    def available_percent(self) -> float | None:
        if not self.mem_total or self.mem_available is None:
            return None
        return 100.0 * self.mem_available / self.mem_total


def parse_meminfo(text: str) -> MemInfo:
    raw = kv_lines(text, sep=":")
    return MemInfo(**{field: kib_to_bytes(raw.get(key)) for field, key in MEMINFO_KEYS.items()})


def read_meminfo(root: Path = Path("/proc")) -> MemInfo:
    text = read_text(root / "meminfo")
    return parse_meminfo(text) if text is not None else MemInfo()
