"""memleak's BPF tables read back (bpf/memleak.c's maps): the outstanding blocks of a pid (for the
reachability scan, and to price it), the series of outstanding bytes sampled per stack, every stack
key's stack named (kernel frames by kallsyms; user frames recovered, symbolized and mixed with the
Python frames recorded) and merged into LeakStacks, and the large allocations snooped."""

from __future__ import annotations

import ctypes as ct

from memdiag.system import clock

from ..base import disarm
from ..cpython.frames import PythonStacks, mixed
from ..growth import RawStack, Spaces, merge_groups, symbolize
from ..stacks import Symbolizer, recover
from .reach import Blocks, merged
from .result import BigAlloc, LeakStack

_FORWARD_DEPTH = 8  # wrappers sit just above the allocator: frames deeper are never read for forwarding


class _StackKey(ct.Structure):
    _fields_ = [("tgid", ct.c_uint32), ("stack_id", ct.c_int32), ("ip", ct.c_uint64), ("at_sp", ct.c_uint64)]


class BigAllocEvent(ct.Structure):  # struct big_alloc in bpf/memleak.c
    _fields_ = [
        ("ts_ns", ct.c_uint64),
        ("size", ct.c_uint64),
        ("addr", ct.c_uint64),
        ("key", _StackKey),
        ("comm", ct.c_char * 16),
    ]


def key_tuple(k) -> tuple:
    return (k.tgid, k.stack_id, k.ip, k.at_sp)


def outstanding_blocks(bpf, pid: int, keys: list[tuple], final: bool) -> Blocks:
    """The outstanding blocks of pid from the allocs table, each grouped by its stack key; keys
    receives the key of each group number. final: read with the target stopped, for the scan (the
    probe's books stop there); otherwise a look while it runs, to price the scan."""
    import numpy as np

    table = bpf["allocs"]
    raw_keys, raw_values, n = table.dump()
    info = np.dtype(
        [("size", "<u8"), ("ts", "<u8"), ("tgid", "<u4"), ("stack_id", "<i4"), ("ip", "<u8"), ("at_sp", "<u8")]
    )
    assert info.itemsize == ct.sizeof(table.Leaf), "struct alloc_info changed: update the dtype"
    if final:
        # The books stop here, with the target stopped: every figure of the result is this instant's,
        # the same as the scan's (the probes stay attached until detach, but record nothing more).
        disarm(bpf)
    addrs = np.frombuffer(raw_keys, dtype="<u8", count=n)
    values = np.frombuffer(raw_values, dtype=info, count=n)
    mine = values["tgid"] == pid
    addrs, values = addrs[mine], values[mine]
    fields = np.stack(
        [values["tgid"].astype(np.int64), values["stack_id"].astype(np.int64),
         values["ip"].view(np.int64), values["at_sp"].view(np.int64)], axis=1,
    )  # fmt: skip
    if not len(addrs):
        return Blocks(addrs, values["size"], np.zeros(0, dtype=np.int64))
    unique, groups = np.unique(fields, axis=0, return_inverse=True)
    keys.extend((int(t), int(s), int(i) & (2**64 - 1), int(a) & (2**64 - 1)) for t, s, i, a in unique.tolist())
    return Blocks(addrs.copy(), values["size"].copy(), groups.reshape(-1).astype(np.int64))


def sample_series(bpf, elapsed: float, times: list[float], series: dict[tuple, list[int]]) -> None:
    index = len(times)
    times.append(round(elapsed, 3))
    for k, v in bpf["per_stack"].items():
        points = series.setdefault(key_tuple(k), [])
        points.extend([0] * (index - len(points)))  # a stack first seen now had nothing before
        points.append(v.outstanding_bytes)
    for points in series.values():
        points.extend([points[-1] if points else 0] * (index + 1 - len(points)))


def _raw_stacks(bpf, kernel_mode: bool, python: PythonStacks) -> list[RawStack]:
    """Each per-stack entry as a RawStack keyed by its table key: its frame-pointer walk, and in user
    mode the registers and stack copy the program saved for .eh_frame unwinding, and the Python
    frames its walk recorded (CPython targets)."""
    stack_table, samples = bpf["stacks"], bpf["samples"]
    raw = []
    for k, _v in bpf["per_stack"].items():
        fp = list(stack_table.walk(k.stack_id)) if k.stack_id >= 0 else ([k.ip] if k.ip else [])
        regs = data = None
        if not kernel_mode:
            try:
                s = samples[k]
                regs, data = (s.regs.ip, s.regs.sp, s.regs.bp), bytes(bytearray(s.data)[: s.len])
            except KeyError:
                pass
        py = [] if kernel_mode else python.frames(bpf, k, k.tgid)
        raw.append(
            RawStack(pid=k.tgid, fp_stack=fp, regs=regs, stack=data, count=0, bytes=0, key=key_tuple(k), python=py)
        )
    return raw


def _kernel_frames(bpf, raw: list[RawStack]):
    """(raw, frames, functions, forwards, method, unknown) of kernel stacks, named by kallsyms."""
    for r in raw:
        frames = [bpf.ksym(a, show_offset=True).decode(errors="replace") for a in r.fp_stack]
        unknown = sum(1 for f in frames if f.startswith("[unknown]"))
        yield r, frames, [f.split("+")[0] for f in frames], [], "kernel frame pointers / ORC", unknown, []


def _user_frames(raw: list[RawStack], spaces: Spaces):
    """The same of user stacks: recovered, symbolized (growth.symbolize), the wrappers' code read."""
    for s in symbolize(raw, spaces):
        forwards = [s.symbolizer.forwards(a) for a in s.addresses[:_FORWARD_DEPTH]]
        unknown = sum(1 for f in s.frames if not f.known)
        frames, functions = mixed([str(f) for f in s.frames], [f.function for f in s.frames], s.raw.python)
        yield s.raw, frames, functions, forwards, s.method, unknown, s.frames


def _merge(m: LeakStack, item: LeakStack) -> LeakStack:
    """Two stack keys that symbolize alike (the same frames of one pid; a CPython target's same
    Python call path) as one stack, the heavier's frames standing for it."""
    ages = [a for a in (m.oldest_age_s, item.oldest_age_s) if a is not None]
    if item.outstanding_bytes > m.outstanding_bytes:
        update = {"frames": item.frames, "functions": item.functions, "forwards": item.forwards, "native": item.native}
        m = m.model_copy(update=update)
    return m.model_copy(
        update={
            "outstanding_bytes": m.outstanding_bytes + item.outstanding_bytes,
            "outstanding_count": m.outstanding_count + item.outstanding_count,
            "allocs": m.allocs + item.allocs,
            "frees": m.frees + item.frees,
            "alloc_bytes": m.alloc_bytes + item.alloc_bytes,
            "freed_bytes": m.freed_bytes + item.freed_bytes,
            "oldest_age_s": max(ages) if ages else None,
            "series": [a + b for a, b in zip(m.series, item.series, strict=False)] or item.series,
            "reach": merged(m.reach, item.reach),
        }
    )


def leak_stacks(
    bpf,
    kernel_mode: bool,
    spaces: Spaces,
    series: dict[tuple, list[int]],
    python: PythonStacks,
    oldest: dict,
    now_ns: int,
    reached: dict,
) -> list[LeakStack]:
    """Every stack key's stack, named, with its books, its series and its reach; keys that name
    alike merged (_merge), heaviest first."""
    values = {key_tuple(k): v for k, v in bpf["per_stack"].items()}
    raw = _raw_stacks(bpf, kernel_mode, python)
    named = _kernel_frames(bpf, raw) if kernel_mode else _user_frames(raw, spaces)

    def books(r: RawStack, frames, functions, forwards, method: str, unknown: int, native) -> tuple[tuple, LeakStack]:
        key, v = r.key, values[r.key]
        item = LeakStack(
            frames=frames,
            functions=functions,
            forwards=forwards,
            pid=r.pid,
            method=method,
            unknown_frames=unknown,
            outstanding_bytes=v.outstanding_bytes,
            outstanding_count=v.outstanding_count,
            allocs=v.allocs,
            frees=v.frees,
            alloc_bytes=v.alloc_bytes,
            freed_bytes=v.freed_bytes,
            oldest_age_s=(now_ns - oldest[key]) / 1e9 if key in oldest else None,
            series=series.get(key, []),
            reach=reached.get(key),
            native=native,
        )
        group = python.group(r.pid, frames, by_entry=True)
        if python.is_arenas(group):
            item = item.model_copy(update={"arenas": True})
        return (r.pid, group), item

    return merge_groups((books(*n) for n in named), _merge, lambda s: s.outstanding_bytes)


def big_alloc(bpf, b, spaces: Spaces, kernel_mode: bool) -> BigAlloc:
    frames: list[str] = []
    if b.key.stack_id >= 0 or (not kernel_mode and b.key.ip):
        # no frame-pointer walk where rbp was not a frame pointer: the stack copy names the frames
        addresses = list(bpf["stacks"].walk(b.key.stack_id)) if b.key.stack_id >= 0 else [b.key.ip]
        if kernel_mode:
            frames = [bpf.ksym(a, show_offset=True).decode(errors="replace") for a in addresses]
        else:
            try:
                samples = bpf["samples"]
                key = samples.Key(tgid=b.key.tgid, stack_id=b.key.stack_id, ip=b.key.ip, at_sp=b.key.at_sp)
                s = samples[key]
                addresses, _ = recover(
                    spaces.get(b.key.tgid),
                    addresses,
                    (s.regs.ip, s.regs.sp, s.regs.bp),
                    bytes(bytearray(s.data)[: s.len]),
                )
            except KeyError:
                pass
            frames = [str(f) for f in Symbolizer(spaces.get(b.key.tgid), jit=True).frames(addresses)]
    boot = clock.boot_offset()
    return BigAlloc(
        pid=b.key.tgid,
        comm=b.comm.decode(errors="replace"),
        size=b.size,
        address=b.addr,
        when=boot + b.ts_ns / 1e9,
        frames=frames,
    )
