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
import functools
import json
import os
import platform
import time
from pathlib import Path

from memdiag.system import arch
from memdiag.system._parse import Model

from ..allocator import BPF_FUNCTION, Placement, allocator_module, find_allocator, is_emulated
from ..base import ProbeUnavailable, bpf_stats, load, program_stats, set_targets
from ..compiler import CompileError, program_text, sha256
from ..elf import elf_info
from .options import build_options

CACHE = Path("/var/lib/memdiag/costs.json")
CALLS = 20000
SCHEMA = 3  # a cache written by an older layout is measured again
WALK_EXTRA_FRAMES = 30  # Python frames added to this process's own stack to measure the walk per frame


class Costs(Model):
    """Nanoseconds added per call."""

    schema_version: int = SCHEMA
    emulated_ns: float  # trap of a uprobe on an emulated instruction (push, nop)
    stepped_ns: float  # trap of a uprobe on an instruction the kernel single-steps
    return_ns: float  # a return probe's trap on top of its entry probe
    program_ns: dict[str, float] = {}  # memleak's programs: run time per hit (BPF stats)
    # the Python frame walk an allocation's program adds for a CPython target (bpf/pyframes.h),
    # measured on this process, a CPython itself: a fixed part and a part per frame; None: not measured
    python_walk_ns: float | None = None
    python_frame_ns: float | None = None
    host: str


@functools.cache  # its parts do not change while memdiag runs (serve prices many diagnoses)
def _host_key() -> str:
    """What the figures depend on: kernel, CPU, the programs measured, and the C library the
    calibration calls (its build id)."""
    cpu = ""
    with contextlib.suppress(OSError):
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    h = sha256()
    for name in ("memleak", "ratecount"):
        with contextlib.suppress(OSError):
            h.update(program_text(name).encode())
    path = _libc_path()
    libc = elf_info(path) if path else None
    return f"{platform.release()} | {cpu} | {h.hexdigest()[:12]} | {(libc.build_id() if libc else None) or ''}"


def _libc_path() -> str:
    return allocator_module(os.getpid()) or ""


def _loop(libc, n: int) -> float:
    malloc, free = libc.malloc, libc.free
    start = time.perf_counter_ns()
    for _ in range(n):
        free(malloc(64))
    return (time.perf_counter_ns() - start) / n


def _best(libc) -> float:
    return min(_loop(libc, CALLS) for _ in range(3))


def _offset_of_kind(p: Placement, emulated: bool) -> int | None:
    """The first instruction of p's function, before any jump, that the kernel emulates (or
    single-steps): every call executes it. None when there is none (e.g. endbr64 at +0 makes a
    CET build's +0 single-stepped; a prologue may have no push)."""
    elf = elf_info(p.module)
    code = elf.read_at(p.symbol_address, 64) if elf is not None else None
    import capstone  # only when the host's costs are measured (once per kernel and CPU)

    md = arch.disassembler()
    for ins in md.disasm(code or b"", p.symbol_address):
        if is_emulated(ins) == emulated:
            return ins.address - p.symbol_address
        if ins.group(capstone.CS_GRP_JUMP) or ins.group(capstone.CS_GRP_CALL) or ins.group(capstone.CS_GRP_RET):
            return None
    return None


def _traps(libc, malloc: Placement, free: Placement) -> tuple[float, float, float] | None:
    """(emulated, stepped, return) trap costs with a program that only counts, each measured at
    an instruction decoded to be of that kind (in malloc or free, whichever has one)."""
    sites = {}
    for emulated in (True, False):
        for p in (malloc, free):
            off = _offset_of_kind(p, emulated)
            if off is not None:
                sites[emulated] = (p, off)
                break
    if len(sites) < 2:
        return None  # a kind not found: no figure rather than a wrong one
    pid = os.getpid()
    bpf = load("ratecount", {})
    try:
        base = _best(libc)
        cost = {}
        for slot, (emulated, (p, off)) in enumerate(sites.items()):
            bpf.attach_uprobe(
                name=p.module.encode(),
                sym=p.function.encode(),
                sym_off=off,
                fn_name=f"count_site_{slot}".encode(),
                pid=pid,
            )
            cost[emulated] = _best(libc) - base
            bpf.detach_all()
        # a return probe: malloc+0 with and without its return probe (memleak's entry probe on a
        # function with a return probe is at +0 too, so the +0 trap is counted once)
        bpf.attach_uprobe(name=malloc.module.encode(), sym=b"malloc", sym_off=0, fn_name=b"count_site_2", pid=pid)
        entry = _best(libc) - base
        bpf.attach_uretprobe(name=malloc.module.encode(), sym=b"malloc", fn_name=b"count_site_3", pid=pid)
        entry_return = _best(libc) - base
    finally:
        bpf.cleanup()
    return max(cost[True], 1.0), max(cost[False], 1.0), max(entry_return - entry, 1.0)


def _memleak_here(malloc, free):
    """memleak's program attached to this process's malloc and free as memleak attaches them, armed."""
    bpf = load("memleak", {"TARGET_MODE": 1, **build_options()})
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
    except BaseException:
        bpf.cleanup()
        raise
    return bpf


def _programs(libc, malloc, free) -> dict[str, float]:
    """memleak's programs' run time per hit, attached to this process as memleak attaches them."""
    try:
        bpf = _memleak_here(malloc, free)
    except ProbeUnavailable:
        return {}
    try:
        with bpf_stats():
            _loop(libc, CALLS)
            stats = program_stats(bpf) or {}
    finally:
        bpf.cleanup()
    return {name: run_ns / count for name, (count, run_ns) in stats.items() if count}


def _deeper(frames: int, call):
    """call() with that many more Python frames under it."""
    return call() if frames <= 0 else _deeper(frames - 1, call)


def _python_walk(libc, malloc, free, plain_ns: float | None) -> tuple[float, float] | None:
    """(fixed, per frame) ns the Python frame walk adds to malloc's program: this process (memdiag
    runs on CPython) registered as a CPython target, malloc's run time measured at its own depth and
    WALK_EXTRA_FRAMES deeper, against plain_ns without the walk. None where it cannot be measured
    (an interpreter whose frames memdiag does not read)."""
    import traceback

    from ..cpython.frames import PythonStacks
    from ..procmaps import AddressSpace

    if plain_ns is None:
        return None
    try:
        bpf = _memleak_here(malloc, free)
    except ProbeUnavailable:
        return None
    stacks = PythonStacks()
    try:
        if stacks.register(bpf, os.getpid(), AddressSpace.of(os.getpid())) is None:
            return None
        per_run: dict[int, float] = {}
        with bpf_stats():
            for extra in (0, WALK_EXTRA_FRAMES):
                before = (program_stats(bpf) or {}).get("malloc_enter", (0, 0))
                depth = _deeper(extra, lambda: len(traceback.extract_stack()) + 1)
                _deeper(extra, lambda: _loop(libc, CALLS))
                after = (program_stats(bpf) or {}).get("malloc_enter", (0, 0))
                if after[0] <= before[0]:
                    return None
                per_run[depth] = (after[1] - before[1]) / (after[0] - before[0])
    finally:
        stacks.close()
        bpf.cleanup()
    (shallow, ns_shallow), (deep, ns_deep) = sorted(per_run.items())
    frame = max(0.0, (ns_deep - ns_shallow) / max(deep - shallow, 1))
    return max(0.0, ns_shallow - plain_ns - frame * shallow), frame


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
        traps = _traps(libc, malloc, free)
        programs = _programs(libc, malloc, free)
        walk = _python_walk(libc, malloc, free, programs.get("malloc_enter"))
    except (ProbeUnavailable, CompileError, OSError):
        return None
    if traps is None:
        return None
    emulated, stepped, ret = traps
    return Costs(
        emulated_ns=emulated,
        stepped_ns=stepped,
        return_ns=ret,
        program_ns=programs,
        python_walk_ns=walk[0] if walk else None,
        python_frame_ns=walk[1] if walk else None,
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
    if costs is not None and costs.program_ns:  # a partial measurement is used once, never kept
        with contextlib.suppress(OSError):
            CACHE.parent.mkdir(parents=True, exist_ok=True)
            tmp = CACHE.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(costs.model_dump_json())
            tmp.replace(CACHE)  # two calibrations at once: one whole file wins
    return costs
