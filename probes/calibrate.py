"""What a uprobe costs on this host, measured, not assumed: this process calls malloc/free in a
loop through ctypes, without and then with probes placed as memleak places them, and the
difference per call is the price of a trap — on an instruction the kernel emulates, on one it
single-steps, and for a return probe. Then memleak's own programs are attached the same way and
the kernel's BPF statistics give what each program adds on top of its trap (they walk the stack
and update maps: about as much again as the trap on this host). Measured once per kernel and CPU,
kept in /var/lib/memdiag/costs.json."""

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

from .allocator import BPF_FUNCTION, find_allocator
from .base import ProbeUnavailable, bpf_stats, load, program_stats, set_targets

CACHE = Path("/var/lib/memdiag/costs.json")
CALLS = 20000
SCHEMA = 2  # a cache written by an older layout is measured again


class Costs(BaseModel):
    """Nanoseconds added per call."""

    schema_version: int = SCHEMA
    emulated_ns: float  # trap of a uprobe on an emulated instruction (push, nop)
    stepped_ns: float  # trap of a uprobe on an instruction the kernel single-steps
    return_ns: float  # a return probe's trap on top of its entry probe
    program_ns: dict[str, float] = {}  # memleak's programs: run time per hit (BPF stats)
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


def _best(libc) -> float:
    return min(_loop(libc, CALLS) for _ in range(3))


def _traps(libc, malloc, free) -> tuple[float, float, float] | None:
    """(emulated, stepped, return) trap costs with a program that only counts."""
    try:
        bpf = load("ratecount", {})
    except ProbeUnavailable:
        return None
    pid = os.getpid()
    try:
        base = _best(libc)
        bpf.attach_uprobe(
            name=malloc.module.encode(), sym=b"malloc", sym_off=malloc.offset, fn_name=b"count_site_0", pid=pid
        )
        entry = _best(libc) - base
        bpf.attach_uretprobe(name=malloc.module.encode(), sym=b"malloc", fn_name=b"count_site_1", pid=pid)
        entry_return = _best(libc) - base
        bpf.detach_all()
        # free+0 is single-stepped where its first instruction is not emulated (test %rdi in glibc)
        bpf.attach_uprobe(name=free.module.encode(), sym=b"free", sym_off=0, fn_name=b"count_site_2", pid=pid)
        stepped = _best(libc) - base
    finally:
        bpf.cleanup()
    return max(entry, 1.0), max(stepped, 1.0), max(entry_return - entry, 1.0)


def _programs(libc, malloc, free) -> dict[str, float]:
    """memleak's programs' run time per hit, attached to this process as memleak attaches them."""
    from .memleak import build_options  # memleak prices itself with these costs: imported late

    try:
        bpf = load("memleak", {"TARGET_MODE": 1, **build_options()})
    except ProbeUnavailable:
        return {}
    pid = os.getpid()
    try:
        set_targets(bpf, {pid})
        for p in (malloc, free):
            bpf.attach_uprobe(
                name=p.module.encode(),
                sym=p.function.encode(),
                sym_off=p.offset,
                fn_name=BPF_FUNCTION[p.function].encode(),
                pid=pid,
            )
            if p.return_probe:
                bpf.attach_uretprobe(name=p.module.encode(), sym=p.function.encode(), fn_name=b"alloc_return", pid=pid)
        bpf["control"][ctypes.c_int(0)] = ctypes.c_uint(1)
        with bpf_stats():
            _loop(libc, CALLS)
            stats = program_stats(bpf) or {}
    finally:
        bpf.cleanup()
    return {name: run_ns / count for name, (count, run_ns) in stats.items() if count}


def _measure() -> Costs | None:
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    alloc = find_allocator(os.getpid())
    if alloc is None:
        return None
    malloc = next(p for p in alloc.placements if p.function == "malloc")
    free = next(p for p in alloc.placements if p.function == "free")
    traps = _traps(libc, malloc, free)
    if traps is None:
        return None
    emulated, stepped, ret = traps
    return Costs(
        emulated_ns=emulated,
        stepped_ns=stepped,
        return_ns=ret,
        program_ns=_programs(libc, malloc, free),
        host=_host_key(),
    )


def host_costs(refresh: bool = False) -> Costs | None:
    key = _host_key()
    if not refresh:
        try:
            cached = Costs.model_validate(json.loads(CACHE.read_text()))
            if cached.host == key and cached.schema_version == SCHEMA:
                return cached
        except (OSError, ValueError):
            pass
    costs = _measure()
    if costs is not None:
        with contextlib.suppress(OSError):
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            CACHE.write_text(costs.model_dump_json())
    return costs
