"""oomkill: every OOM kill while it runs — victim, trigger (and its stacks), memory cgroup and
its limit, cgroup OOM or system OOM, host MemAvailable at that moment.

On the oom:mark_victim tracepoint (near-zero cost: it fires only on a kill). Where kprobes exist
oom_kill_process would add the OOM control structure; this probe needs only the tracepoint, and
completes each kill from the kernel log (constraint, oom_memcg) and the victim's cgroup files.

Pids are memdiag's /proc numbers. In a pid namespace of memdiag's own, the kernel (tracepoint
and log) names the victim by its host pid: the program translates it (bpf/oomkill.c victim_ns),
and a victim or trigger outside memdiag's namespace has no number here: its pid is None, the
host's number is kept in victim_host_pid, and /proc is never read for it."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from functools import cache

from memdiag.system import clock
from memdiag.system._parse import Model
from memdiag.system.cgroup import (
    BadCgroup,
    locate_memory_cgroup,
    memcg_matches,
    read_cgroup_memory,
    resolve_cgroup,
)
from memdiag.system.kmsg import OomKill, read_oom_kills
from memdiag.system.meminfo import read_meminfo
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes

from . import bpfstats, btf, kernel
from .base import (
    ProbeUnavailable,
    attached,
    bpf_stats,
    load,
    measure_cost,
    require,
    stop_on_signals,
    unavailable,
)
from .face import Face, ProbeResult, plain
from .procmaps import AddressSpace
from .stacks import Symbolizer
from .text import stack_lines

FORMAT = "events/oom/mark_victim/format"


class OomEvent(Model):
    when: float
    victim_pid: int | None  # as memdiag's /proc names it; None: not in memdiag's pid namespace
    victim_host_pid: int | None = None  # as the kernel and its log name it (the initial namespace)
    victim_own_pid: int | None = None  # in its own innermost pid namespace (a container's ps); None: unknown
    victim_comm: str
    trigger_pid: int | None  # None: the trigger is not in memdiag's pid namespace
    outside_namespace: str | None = None  # says which of victim and trigger memdiag's /proc cannot see
    trigger_comm: str
    cgroup_oom: bool | None = None  # None: the kernel log did not say
    constraint: str | None = None
    memcg: str | None = None  # the cgroup whose limit was hit (memcg OOM) or the victim's
    victim_cgroup: str | None = None
    limit: int | None = None
    mem_available: int | None = None  # host, read when the event arrived
    mem_total: int | None = None
    anon_rss: int | None = None
    file_rss: int | None = None
    shmem_rss: int | None = None
    total_vm: int | None = None
    oom_score_adj: int | None = None
    trigger_user_stack: list[str] = []
    trigger_kernel_stack: list[str] = []

    def victim(self) -> str:
        """ "PID n (comm)"; a victim outside memdiag's pid namespace by the host's number, said so;
        its number in a pid namespace of its own beside it."""
        pid = f"PID {self.victim_pid}" if self.victim_pid is not None else f"host PID {self.victim_host_pid}"
        own = self.victim_own_pid
        inside = f", PID {own} in its pid namespace" if own not in (None, self.victim_pid, self.victim_host_pid) else ""
        return f"{pid} ({self.victim_comm}{inside})"

    def trigger(self) -> str:
        pid = f"PID {self.trigger_pid}" if self.trigger_pid is not None else "a task outside memdiag's pid namespace"
        return f"{pid} ({self.trigger_comm})"


class OomKillResult(ProbeResult):
    kills: list[OomEvent] = []


def requirements() -> list[kernel.Availability]:
    return [kernel.tracepoint("oom", "mark_victim")]


def describe(r: OomKillResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe oomkill`: each kill, its trigger's stack."""
    lines = []
    for k in r.kills:
        scope = "cgroup OOM" if k.cgroup_oom else ("system OOM" if k.cgroup_oom is False else "OOM")
        lines.append(
            f"  {scope}: killed {k.victim()}, anon RSS {fmt_bytes(k.anon_rss)}; "
            f"trigger {k.trigger()}; memcg {k.memcg or k.victim_cgroup}, "
            f"limit {fmt_bytes(k.limit)}; host MemAvailable {fmt_bytes(k.mem_available)}"
        )
        if k.outside_namespace:
            lines.append(f"    {k.outside_namespace}")
        lines += stack_lines(k.trigger_kernel_stack, depth=6)
    if not r.kills:
        lines.append("  no OOM kill")
    return lines


def _format_fields() -> str:
    root = kernel.tracefs_root()
    try:
        return (root / FORMAT).read_text() if root else ""
    except OSError:
        return ""


def _ksym(bpf, address: int) -> str:
    return bpf.ksym(address, show_offset=True).decode(errors="replace")


def build_options(fmt: str | None = None) -> dict[str, int | str]:
    """What this kernel's oom:mark_victim carries beyond the pid (older kernels: the pid alone),
    from its tracefs format (fmt: another kernel's, for a test of that kernel's branch)."""
    fmt = _format_fields() if fmt is None else fmt
    defines: dict[str, int | str] = {}
    if "anon_rss" in fmt:
        defines["HAVE_VICTIM_RSS"] = 1
    if "__data_loc char[] comm" in fmt:
        defines["HAVE_VICTIM_COMM"] = 1
    # the tracepoint's uid field came with its task_struct argument (TP_PROTO(task, uid)); before,
    # the raw tracepoint received a bare pid
    if "uid_t uid" in fmt:
        defines.update(_victim_task_offsets())
    return defines


@cache
def _victim_task_offsets() -> dict[str, int | str]:
    """Where the victim's pid in each namespace sits (task->thread_pid->numbers[level]), from the
    kernel's BTF; empty when BTF lacks any of them (no translation: in a pid namespace of memdiag's
    own victims get victim_pid None; anywhere, victim_own_pid stays None)."""
    b = btf.vmlinux()
    if b is None:
        return {}
    inum = (b.offset("pid_namespace", "ns"), b.offset("ns_common", "inum"))
    found = {
        "TASK_PID": b.offset("task_struct", "pid"),
        "TASK_THREAD_PID": b.offset("task_struct", "thread_pid"),
        "PID_LEVEL": b.offset("pid", "level"),
        "PID_NUMBERS": b.offset("pid", "numbers"),
        "UPID_SIZE": b.size("upid"),
        "UPID_NR": b.offset("upid", "nr"),
        "UPID_NS": b.offset("upid", "ns"),
        "PIDNS_INUM": None if None in inum else inum[0] + inum[1],
    }
    return {} if None in found.values() else found


class OomWatch:
    """The loaded probe; poll() delivers OomEvents to a callback. Used by run() for a bounded
    window and by `memdiag serve` for an always-on watch."""

    def __init__(self, options: dict[str, int | str] | None = None) -> None:
        """options: the program's build options (default: this kernel's tracepoint, build_options())."""
        require(*requirements())
        self.bpf = load("oomkill", build_options() if options is None else options)
        self.lost = 0
        self.pending: list[OomEvent] = []
        self.spaces: dict[int, AddressSpace] = {}
        self.in_namespace = kernel.pid_namespace() is not None
        self.has_numbers = "victim_ns" in self.bpf.tables
        self.translated = self.has_numbers if self.in_namespace else True
        self._boot_offset = clock.boot_offset()
        self.bpf["events"].open_perf_buffer(self._on_event, lost_cb=self._on_lost)

    def _on_lost(self, count: int) -> None:
        self.lost += count

    def _on_event(self, cpu, data, size) -> None:
        e = self.bpf["events"].event(data)
        meminfo = read_meminfo()
        victim, own = self._victim_pids(e.victim_host_pid)
        trigger = e.trigger_pid or None  # 0: current_pid_tgid found it outside memdiag's namespace
        victim_cgroup, limit = _cgroup_of(victim)  # the victim is often still there for a moment
        # A trigger that is also the victim may be gone already: use the maps kept while it ran.
        # Its files are held open at once: a dying process's map_files and root go with it.
        now = AddressSpace.of(trigger) if trigger else None
        space = now.hold() if now is not None else self.spaces.get(trigger) if trigger else None
        user_stack = []
        if e.user_stack_id >= 0:
            sym = Symbolizer(space)
            user_stack = [str(f) for f in sym.frames(self.bpf["stacks"].walk(e.user_stack_id))]
        kernel_stack = []
        if e.kernel_stack_id >= 0:
            kernel_stack = [_ksym(self.bpf, a) for a in self.bpf["stacks"].walk(e.kernel_stack_id)]
        victim_comm = e.victim_comm.decode(errors="replace")
        # The tracepoint's sizes are in KiB (mm/oom_kill.c stores K(get_mm_counter(...))), 6.2+.
        rss = 1024 if e.total_vm or e.anon_rss else None
        self.pending.append(
            OomEvent(
                when=self._boot_offset + e.ts_ns / 1e9,
                victim_pid=victim,
                victim_host_pid=e.victim_host_pid,
                victim_own_pid=own,
                victim_comm=victim_comm or "",
                trigger_pid=trigger,
                trigger_comm=e.trigger_comm.decode(errors="replace"),
                victim_cgroup=victim_cgroup,
                limit=limit,
                mem_available=meminfo.mem_available,
                mem_total=meminfo.mem_total,
                anon_rss=e.anon_rss * rss if rss else None,
                file_rss=e.file_rss * rss if rss else None,
                shmem_rss=e.shmem_rss * rss if rss else None,
                total_vm=e.total_vm * rss if rss else None,
                oom_score_adj=e.oom_score_adj if rss else None,
                trigger_user_stack=user_stack,
                trigger_kernel_stack=kernel_stack,
            )
        )

    def _victim_pids(self, host_pid: int) -> tuple[int | None, int | None]:
        """The victim as memdiag's /proc names it (the host's pid in the initial namespace; in a
        namespace of memdiag's own, the program's translation, None: not in it, or not yet) and
        as its own pid namespace does (None: not known yet, or not on this kernel)."""
        numbers = None
        if self.has_numbers:
            try:
                numbers = self.bpf["victim_ns"][host_pid]
            except KeyError:
                pass  # the raw tracepoint may not have run yet: poll() asks again
            else:
                del self.bpf["victim_ns"][host_pid]
        own = (numbers.inner_nr or None) if numbers is not None else None
        if not self.in_namespace:
            return host_pid, own
        return ((numbers.ns_nr or None) if numbers is not None else None), own

    def _settle(self, e: OomEvent) -> OomEvent:
        """An event whose victim's numbers were not in the program's map on arrival: ask once more;
        in a namespace of memdiag's own, say honestly which of victim and trigger its /proc cannot name."""
        update: dict = {}
        if e.victim_own_pid is None and self.has_numbers and e.victim_host_pid is not None:
            victim, own = self._victim_pids(e.victim_host_pid)
            update["victim_own_pid"] = own
            if self.in_namespace and e.victim_pid is None and victim is not None:
                update["victim_pid"] = victim
                update["victim_cgroup"], update["limit"] = _cgroup_of(victim)
        if not self.in_namespace:
            return e.model_copy(update=update)
        outside = []
        if update.get("victim_pid", e.victim_pid) is None:
            how = "is not in it" if self.translated else "cannot be named in it on this kernel (no BTF offsets)"
            outside.append(f"the victim (host PID {e.victim_host_pid}) {how}")
        if e.trigger_pid is None:
            outside.append("the trigger is not in it")
        if outside:
            update["outside_namespace"] = "memdiag runs in a pid namespace of its own: " + " and ".join(outside)
        return e.model_copy(update=update)

    def poll(self, timeout_ms: int = 200) -> list[OomEvent]:
        """Events that arrived, completed from the kernel log (which the kernel writes as it kills)."""
        self.bpf.perf_buffer_poll(timeout=timeout_ms)
        if not self.pending:
            return []
        time.sleep(0.05)  # the log lines follow the tracepoint by microseconds
        # the log names victims by host pid, in any namespace: matched with the tracepoint's host pid
        logged = {k.victim_pid: k for k in (read_oom_kills() or [])}
        done = [_complete(self._settle(e), logged.get(e.victim_host_pid)) for e in self.pending]
        self.pending = []
        return done

    def keep_maps(self, pids: set[int]) -> None:
        """Remember the address spaces of these processes, to symbolize them if they die first."""
        for pid in pids:
            space = AddressSpace.of(pid)
            if space is not None:
                self.spaces[pid] = space.hold()

    def stats(self) -> tuple[int, int]:
        stats = bpfstats.read(self.bpf, bpfstats.OOM)
        return stats["events"], stats["stack_errors"]

    def close(self) -> None:
        self.bpf.cleanup()


def _cgroup_of(pid: int | None) -> tuple[str | None, int | None]:
    """The memory cgroup of a process memdiag's /proc shows, and its effective limit."""
    loc = locate_memory_cgroup(pid) if pid else None
    if loc is None:
        return None, None
    with contextlib.suppress(BadCgroup, OSError):
        return loc.path, read_cgroup_memory(loc).effective_limit
    return loc.path, None


def _limit_of(cgroup_path: str) -> int | None:
    """The effective limit of a memory cgroup named by its path (None: gone or unreadable)."""
    with contextlib.suppress(BadCgroup, OSError):
        return read_cgroup_memory(resolve_cgroup(cgroup_path)).effective_limit
    return None


def _complete(e: OomEvent, log: OomKill | None) -> OomEvent:
    update: dict = {}
    if log is not None:
        update.update(
            constraint=log.constraint,
            cgroup_oom=log.cgroup_oom,
            memcg=log.oom_memcg if log.cgroup_oom else log.task_memcg,
        )
        # A dying victim read from /proc can already show the root (seen in CI: "/" for a task
        # killed in its 64 MiB cgroup), and the limit read beside it is then the root's: the
        # kernel's own record of its cgroup at the kill is taken instead.
        if log.task_memcg and e.victim_cgroup in (None, "/") and log.task_memcg != e.victim_cgroup:
            update["victim_cgroup"] = log.task_memcg
            update["limit"] = _limit_of(log.task_memcg)
        if not e.victim_comm:
            update["victim_comm"] = log.victim_comm
        if e.anon_rss is None:
            update.update(anon_rss=log.anon_rss, file_rss=log.file_rss, shmem_rss=log.shmem_rss, total_vm=log.total_vm)
        if e.limit is None and "limit" not in update and update.get("memcg"):
            with contextlib.suppress(BadCgroup, OSError):
                update["limit"] = read_cgroup_memory(resolve_cgroup(update["memcg"])).effective_limit
    return e.model_copy(update=update)


def _concerns(target: Target, e: OomEvent) -> bool:
    if target.kind == "system":
        return True
    if target.kind == "pid":
        return target.pid in (e.victim_pid, e.trigger_pid)
    path = target.cgroup.path if target.cgroup is not None else ""
    return any(memcg_matches(cg, path) for cg in (e.victim_cgroup, e.memcg))


def run(
    target: Target,
    duration: float,
    on_kill: Callable[[OomEvent], None] | None = None,
    ready: threading.Event | None = None,
    options: dict[str, int | str] | None = None,
) -> OomKillResult:
    started = clock.wall()
    try:
        watch = OomWatch(options)
    except ProbeUnavailable as e:
        return OomKillResult(**unavailable("oomkill", target, str(e)))
    except Exception as e:
        return OomKillResult(name="oomkill", status="error", reason=f"loading failed: {e}", target=target.describe())
    kills: list[OomEvent] = []
    if ready is not None:
        ready.set()
    attached("oomkill")
    try:
        with bpf_stats(), stop_on_signals() as stop:
            deadline = time.monotonic() + duration
            while time.monotonic() < deadline and not stop.interrupted:
                watch.keep_maps(target.pids())
                for e in watch.poll(200):
                    if _concerns(target, e):
                        kills.append(e)
                        if on_kill:
                            on_kill(e)
            events, stack_errors = watch.stats()
            cost = measure_cost(watch.bpf, events)
    finally:
        watch.close()
    return OomKillResult(
        name="oomkill",
        status="ok",
        method="tracepoint oom:mark_victim + kernel log + cgroup files",
        target=target.describe(),
        started=started,
        duration_s=clock.wall() - started,
        interrupted=stop.interrupted,
        lost={"events_lost": watch.lost, "stack_errors": stack_errors},
        cost=cost,
        kills=kills,
    )


FACE = Face(
    name="oomkill",
    summary="every OOM kill while it runs: victim, trigger, cgroup and its limit",
    run=plain(run),
    result=OomKillResult,
    describe=describe,
)
