"""fdstack: the file descriptors that hold kernel memory (sockets, socket pairs, accepted sockets,
pipes, eventfds, epoll and inotify instances, memfds, timerfds, signalfds), by the user stack that
created them: how many each stack created, closed, and left open at the end. A service that forgets
to close one on an error path keeps its RSS flat while socket buffers and slab climb; the stacks
with descriptors still open name the code, as memleak's outstanding allocations do for the heap.

Raw syscall tracepoints (bpf/fdstack.c): a creating call's return records each descriptor under
its stack, close() forgets it. At the end every descriptor still recorded is looked up in
/proc/PID/fd: one gone (closed at exit, by close_range, dup2 or exec's close-on-exec, none of them
traced) or now of another kind is counted as closed untraced, never as open.

Its programs run for every syscall of the host: a diagnosis prices it before it attaches (PRICING,
probes/hostwide.py), the host's syscalls counted for half a second with no program attached."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from memdiag.system import arch
from memdiag.system._parse import Model
from memdiag.system.target import Target
from memdiag.system.units import fmt_number

from . import bpfstats, hostwide, kernel
from .base import Run, run_probe
from .face import Face, FactDef, ProbeResult, Stack, Stacks
from .growth import EventStacks, RawStack, StackGrowth
from .text import stack_lines

METHOD = "raw tracepoints sys_enter/sys_exit (descriptor-creating calls, close), kernel stacks + .eh_frame unwinding"
MAX_FDS = 65_536  # open descriptors the program's table holds (its MAX_FDS); more are counted, not kept
# enum fd_kind of bpf/memdiag.h, in its order (tests/unit/test_fdstack.py checks that they agree)
FD_KINDS = (
    "socket", "socketpair", "accepted", "pipe", "eventfd", "epoll", "inotify", "memfd", "timerfd", "signalfd"
)  # fmt: skip
# What /proc/PID/fd/N links to for each kind: a number now of another kind was closed and reused.
LINKS = {
    "socket": "socket:", "socketpair": "socket:", "accepted": "socket:", "pipe": "pipe:",
    "eventfd": "anon_inode:[eventfd]", "epoll": "anon_inode:[eventpoll]", "inotify": "anon_inode:inotify",
    "memfd": "/memfd:", "timerfd": "anon_inode:[timerfd]", "signalfd": "anon_inode:[signalfd]",
}  # fmt: skip
NOT_TRACED = (
    "fdstack counts the descriptors created while it ran, by socket, socketpair, accept/accept4, pipe/pipe2, "
    "eventfd, epoll_create, inotify_init, memfd_create, timerfd_create and signalfd; not those opened before "
    "it started, nor copies made by dup/dup2/dup3/fcntl(F_DUPFD), descriptors received over a socket "
    "(SCM_RIGHTS), files opened by open/openat, or pidfd_open, userfaultfd, perf_event_open, fanotify_init "
    "and io_uring_setup"
)


def _target_filter() -> dict[str, str]:
    return hostwide.syscall_filter(arch.FD_SYSCALLS)


# Priced before it attaches (probes/hostwide.py): both programs run for every syscall of the host.
# Priors, where `memdiag prepare` did not measure this host: BENCHMARKS.md section 9's idle run,
# 110 ns per program run (the host's own syscalls, filtered out), and 355 ns more per descriptor
# the target's calls create or close (its stack walked, its books kept).
PRICING = hostwide.Pricing(
    probe="fdstack",
    tracepoints=("raw_syscalls:sys_enter",),
    programs={"raw_syscalls:sys_enter": ("raw_tracepoint__sys_enter", "raw_tracepoint__sys_exit")},
    priors_ns={"raw_tracepoint__sys_enter": 110.0, "raw_tracepoint__sys_exit": 110.0},
    recorded=("raw_syscalls:sys_enter",),
    recorded_ns=355.0,
    recorded_what="descriptor-creating calls and closes",
    event_what="syscalls (each runs its sys_enter and sys_exit programs)",
    filters=_target_filter,
)


class FdStack(StackGrowth):
    """One creating stack of one kind of descriptor (count: its descriptors still open; bytes: 0,
    the kernel memory behind a descriptor is not measured)."""

    kind: str  # FD_KINDS
    created: int
    closed: int  # by close(), traced
    outstanding: int  # created during the run and open at its end (/proc/PID/fd says so)
    closed_untraced: int = 0  # gone at the end without a traced close (exit, dup2, close_range, exec)
    oldest_age_s: float | None = None  # the age of the oldest still open at the end


class FdTotal(Model):
    """The descriptors of one kind, over every stack."""

    kind: str
    created: int
    closed: int
    outstanding: int


class FdResult(ProbeResult):
    stacks: list[FdStack] = []
    folded: list[str] = []
    by_kind: list[FdTotal] = []
    created: int = 0
    closed: int = 0
    outstanding: int = 0
    closed_untraced: int = 0
    fds_dropped: int = 0  # created when the table of open descriptors was full: never counted open
    table_room: int = MAX_FDS


@dataclass
class Held:
    """What the table of open descriptors holds at the end for one stack key."""

    open: int = 0
    gone: int = 0
    oldest_ns: int | None = None


def requirements() -> list[kernel.Availability]:
    return [kernel.raw_syscall_tracepoints()]


def build_options() -> dict[str, int | str]:
    """The syscall numbers the program compares the raw tracepoints' calls with, and its table's room."""
    return {**arch.syscall_defines(names=arch.FD_SYSCALLS), "MAX_FDS": MAX_FDS}


def _key(k) -> tuple:
    """A counts key (or the key an open descriptor keeps) as a hashable tuple."""
    return (k.tgid, k.stack_id, k.ip, k.at_sp, k.kind)


def still_open(pid: int, fd: int, kind: str) -> bool:
    """Whether /proc/PID/fd/FD is open now and of the kind recorded (not a number reused by another file)."""
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}").startswith(LINKS[kind])
    except OSError:
        return False


def held(bpf, same: Callable[[int], bool] | None) -> dict[tuple, Held]:
    """Per stack key, the descriptors the program still holds: open at the end, or gone. same(pid):
    whether pid is still the process traced (a pid taken by another process holds none of these)."""
    out: dict[tuple, Held] = {}
    for fid, o in bpf["fds"].items():
        h = out.setdefault(_key(o.key), Held())
        pid, kind = fid.tgid, FD_KINDS[o.key.kind] if o.key.kind < len(FD_KINDS) else "socket"
        if (same is None or same(pid)) and still_open(pid, fid.fd, kind):
            h.open += 1
            h.oldest_ns = o.ts if h.oldest_ns is None else min(h.oldest_ns, o.ts)
        else:
            h.gone += 1
    return out


def stacks_of(run: EventStacks, bpf) -> tuple[list[FdStack], int]:
    """Every stack key's books (counts) and descriptors (fds), merged by stack within each kind,
    most still open first; and the symbol look-ups that failed."""
    books = {_key(k): (v.created, v.closed, v.replaced) for k, v in bpf["counts"].items()}
    now, holding = time.monotonic_ns(), held(bpf, run.spaces.same)  # bpf_ktime_get_ns is CLOCK_MONOTONIC
    by_kind: dict[int, list[RawStack]] = {}
    for key, raw in run.raw(bpf, lambda v: v.created, lambda _v: 0):
        by_kind.setdefault(key.kind, []).append(raw.model_copy(update={"key": _key(key)}))
    stacks: list[FdStack] = []
    failed = 0
    for kind, raw in by_kind.items():  # one stack's sockets and its pipes are two stacks
        merged, f = run.merge(raw)
        failed += f
        stacks += [_fd_stack(kind, s, books, holding, now) for s in merged]
    stacks.sort(key=lambda s: (s.outstanding, s.created), reverse=True)
    return stacks, failed


def _fd_stack(kind: int, s: StackGrowth, books: dict, holding: dict[tuple, Held], now: int) -> FdStack:
    """One merged stack with its keys' books summed."""
    created = sum(books.get(k, (0, 0, 0))[0] for k in s.keys)
    closed = sum(books.get(k, (0, 0, 0))[1] for k in s.keys)
    replaced = sum(books.get(k, (0, 0, 0))[2] for k in s.keys)
    hs = [holding[k] for k in s.keys if k in holding]
    oldest = min((h.oldest_ns for h in hs if h.oldest_ns is not None), default=None)
    outstanding = sum(h.open for h in hs)
    fields = s.model_dump() | {"count": outstanding, "bytes": 0, "keys": s.keys}
    return FdStack(
        **fields,
        kind=FD_KINDS[kind] if kind < len(FD_KINDS) else f"kind {kind}",
        created=created,
        closed=closed,
        outstanding=outstanding,
        closed_untraced=replaced + sum(h.gone for h in hs),
        oldest_age_s=None if oldest is None else round(max(0, now - oldest) / 1e9, 1),
    )


def totals(stacks: list[FdStack]) -> list[FdTotal]:
    """The descriptors of each kind over every stack, most still open first."""
    out: dict[str, FdTotal] = {}
    for s in stacks:
        t = out.get(s.kind) or FdTotal(kind=s.kind, created=0, closed=0, outstanding=0)
        out[s.kind] = t.model_copy(
            update={"created": t.created + s.created, "closed": t.closed + s.closed,
                    "outstanding": t.outstanding + s.outstanding}
        )  # fmt: skip
    return sorted(out.values(), key=lambda t: (t.outstanding, t.created), reverse=True)


def run(target: Target, duration: float, top: int = 50) -> FdResult:
    run = EventStacks()

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.FD)
        stacks, failed = stacks_of(run, bpf)
        fields = run.fields(stats, stacks, failed, top, weight="outstanding")
        fields["lost"] = {**fields["lost"], "fds_dropped": stats["fds_dropped"]}
        return {
            "events": stats["created"] + stats["closed"],
            "by_kind": totals(stacks),
            "created": stats["created"],
            "closed": stats["closed"],
            "outstanding": sum(s.outstanding for s in stacks),
            "closed_untraced": sum(s.closed_untraced for s in stacks),
            "fds_dropped": stats["fds_dropped"],
            **fields,
        }

    spec = Run("fdstack", FdResult, requirements(), build_options(), collect, METHOD, spaces=run.spaces)
    return run_probe(spec, target, duration)  # type: ignore[return-value]


def describe(r: FdResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe fdstack`."""
    lines = [
        f"  descriptors: {r.created:,} created, {r.closed:,} closed, {r.outstanding:,} still open at the end"
        + (f", {r.closed_untraced:,} closed untraced" if r.closed_untraced else "")
    ]
    lines += [
        f"    {t.kind:<11} {t.created:>8,} created {t.closed:>8,} closed {t.outstanding:>8,} open" for t in r.by_kind
    ]
    for s in r.stacks[:top]:
        age = f", oldest {s.oldest_age_s:g} s" if s.oldest_age_s is not None else ""
        lines.append(
            f"  {s.outstanding:,} {s.kind} open ({s.created:,} created, {s.closed:,} closed{age}) "
            f"PID {s.pid} via {s.method}:"
        )
        lines += stack_lines(s.frames)
    return lines


def caveats(r: FdResult) -> list[str]:
    out = [NOT_TRACED + "."]
    if r.closed_untraced:
        out.append(
            f"{fmt_number(r.closed_untraced)} descriptors were closed by calls fdstack does not trace (close_range, "
            "dup2 over them, exec's close-on-exec, the process's exit): counted as closed untraced, not as open."
        )
    if r.fds_dropped:
        out.append(
            f"{fmt_number(r.fds_dropped)} descriptors were created once its table of open descriptors was full "
            f"({r.table_room:,}): counted as created, never as open."
        )
    return out


def top_stack(r: FdResult) -> FdStack | None:
    """The stack with the most descriptors still open (None: every one was closed)."""
    return next((s for s in r.stacks if s.outstanding > 0), None)


def facts_of(r: FdResult | None, plan, name) -> dict:
    priced = dict(plan.facts) if isinstance(plan, hostwide.HostWidePlan) else {}
    if r is None or r.status not in ("ok", "partial"):
        return priced
    top = top_stack(r)
    return priced | {
        "fdstack.created": r.created,
        "fdstack.closed": r.closed,
        "fdstack.outstanding": r.outstanding,
        "fdstack.outstanding_rate": r.outstanding / r.duration_s if r.duration_s > 0 else None,
        "fdstack.top_function": name(top.frames, []) if top is not None else None,
        "fdstack.top_type": top.kind if top is not None else None,
        "fdstack.top_outstanding": top.outstanding if top is not None else 0,
    }


def stacks(r: FdResult) -> list[Stack]:
    """The face's stacks: those with descriptors still open, most first (bytes 0: not measured)."""
    return [
        Stack(
            frames=s.frames,
            functions=s.functions,
            bytes=0,
            count=s.outstanding,
            pid=s.pid,
            detail=f"{fmt_number(s.outstanding)} {s.kind} descriptors still open, "
            f"{fmt_number(s.created)} created, {fmt_number(s.closed)} closed",
        )
        for s in r.stacks
        if s.outstanding > 0
    ]


FACE = Face(
    name="fdstack",
    summary="descriptors holding kernel memory (sockets, pipes ...) by the stack that made them",
    run=lambda target, ctx: run(target, hostwide.run_seconds(ctx)),
    result=FdResult,
    describe=describe,
    caveats=caveats,
    facts=(
        FactDef("fdstack.created", "number", "descriptors (sockets, pipes, eventfds ...) created during the probe"),
        FactDef("fdstack.closed", "number", "of those, how many close() closed during the probe"),
        FactDef("fdstack.outstanding", "number", "descriptors created during the probe and still open at its end"),
        FactDef("fdstack.outstanding_rate", "per_s", "descriptors left open per second of the probe"),
        FactDef("fdstack.top_function", "string", "the function of the stack with the most descriptors still open"),
        FactDef("fdstack.top_type", "string", "what that stack's descriptors are: socket, socketpair, pipe, ..."),
        FactDef("fdstack.top_outstanding", "number", "how many descriptors that stack left open"),
        *PRICING.facts(),
    ),
    facts_of=facts_of,
    plan=lambda target, ctx: hostwide.plan(PRICING, target, ctx),
    planning=f"counting the host's syscalls on every CPU for {hostwide.COUNT_S:g} s",
    stacks=Stacks(
        kind="events",
        shown=3,
        of=stacks,
        folded=lambda r: r.folded,
        space=None,
        counted="descriptors",
        folded_by="count",
    ),
)
