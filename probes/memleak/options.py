"""memleak's BPF program as it is built: its -D options, the sizes of its tables, its statistics'
names (probes/bpfstats.py) and what the kernel must offer. The calibration (costs.py) builds the same program."""

from __future__ import annotations

import os

from .. import kernel

MAX_ALLOCS = 262144
MAX_STACKS = 4096  # the stack map is preallocated: about 1 KiB a slot
KMEM_TRACEPOINTS = ("kmalloc", "kfree", "kmem_cache_alloc", "kmem_cache_free", "mm_page_alloc", "mm_page_free")


def requirements(kernel_mode: bool) -> list[kernel.Availability]:
    if kernel_mode:
        return [kernel.tracepoint("kmem", tp) for tp in KMEM_TRACEPOINTS]
    return [kernel.uprobes()]


def build_options(
    kernel_mode: bool = False, sample_every: int = 1, min_size: int = 0, max_size: int | None = None, snoop_min: int = 0
) -> dict[str, int | str]:
    """The -D options of bpf/memleak.c for these parameters."""
    defines: dict[str, int | str] = {
        "KERNEL_MODE": int(kernel_mode),
        "SAMPLE_EVERY": max(1, sample_every),
        "MIN_SIZE": min_size,
        "SNOOP_MIN": snoop_min,
        "MAX_ALLOCS": MAX_ALLOCS,
        "MAX_STACKS": MAX_STACKS,
        "PAGE_BYTES": os.sysconf("SC_PAGE_SIZE"),
        "PY_FRAMES": int(not kernel_mode),  # walked for the pids registered in py_procs only
    }
    if max_size is not None:
        defines["MAX_SIZE"] = f"{max_size}ULL"
    return defines
