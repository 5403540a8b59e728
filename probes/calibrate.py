"""What a uprobe costs on this host, measured, not assumed: this process calls malloc/free in a
loop through ctypes, without and then with probes placed as memleak places them, and the
difference per call is the price of a trap (emulated entry, return probe, single-stepped entry).
Measured once per kernel and CPU, kept in /var/lib/memdiag/costs.json."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import platform
import time
from pathlib import Path

from pydantic import BaseModel

from .allocator import find_allocator
from .base import ProbeUnavailable, load

CACHE = Path("/var/lib/memdiag/costs.json")
CALLS = 20000


class Costs(BaseModel):
    """Nanoseconds added per call."""

    entry_ns: float  # uprobe on an emulated instruction
    entry_return_ns: float  # entry + return probe (what malloc pays)
    stepped_ns: float  # uprobe on an instruction the kernel single-steps
    host: str


def _host_key() -> str:
    cpu = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return f"{platform.release()} | {cpu}"


def _loop(libc, n: int) -> float:
    malloc, free = libc.malloc, libc.free
    start = time.perf_counter_ns()
    for _ in range(n):
        free(malloc(64))
    return (time.perf_counter_ns() - start) / n


def _measure() -> Costs | None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    alloc = find_allocator(os.getpid())
    if alloc is None:
        return None
    malloc = next(p for p in alloc.placements if p.function == "malloc")
    free = next(p for p in alloc.placements if p.function == "free")
    try:
        bpf = load("ratecount", {})
    except ProbeUnavailable:
        return None
    try:
        base = min(_loop(libc, CALLS) for _ in range(3))
        pid = os.getpid()
        bpf.attach_uprobe(
            name=malloc.module.encode(), sym=b"malloc", sym_off=malloc.offset, fn_name=b"count_call", pid=pid
        )
        entry = min(_loop(libc, CALLS) for _ in range(3)) - base
        bpf.attach_uretprobe(name=malloc.module.encode(), sym=b"malloc", fn_name=b"count_call", pid=pid)
        entry_return = min(_loop(libc, CALLS) for _ in range(3)) - base
        bpf.detach_all()
        # free+0 is single-stepped where its first instruction is not emulated (test %rdi in glibc)
        bpf.attach_uprobe(name=free.module.encode(), sym=b"free", sym_off=0, fn_name=b"count_call", pid=pid)
        stepped = min(_loop(libc, CALLS) for _ in range(3)) - base
    finally:
        bpf.cleanup()
    return Costs(
        entry_ns=max(entry, 1.0), entry_return_ns=max(entry_return, 1.0), stepped_ns=max(stepped, 1.0), host=_host_key()
    )


def host_costs(refresh: bool = False) -> Costs | None:
    key = _host_key()
    if not refresh:
        try:
            cached = Costs.model_validate(json.loads(CACHE.read_text()))
            if cached.host == key:
                return cached
        except (OSError, ValueError):
            pass
    costs = _measure()
    if costs is not None:
        with contextlib.suppress(OSError):
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            CACHE.write_text(costs.model_dump_json())
    return costs
