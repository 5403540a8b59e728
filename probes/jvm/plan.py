"""Whether a flight recording may run on this JVM, and at what price, before anything is sent to it.

Refused (never signalled, the counters still read) when the target is no HotSpot JVM, accepts no
attach (-XX:+DisableAttachMechanism), has no listener and does not catch SIGQUIT (-Xrs: a signal
would end it), or this host has no jfr tool memdiag trusts to read the recording with (it never
runs the target's own). Otherwise priced by what the application would pay (issue 45,
BENCHMARKS.md section 8): the JVM's CPU time to start JFR (cold: its first start in this JVM,
which JIT-compiles JFR's own code; warm: JFR's threads are there from an earlier recording), to
record for the time asked, to look and to stop (probes/jvm/costs.py: this host's measurements of
the JVM's build, else the priors), of which the application pays the share of the CPUs its own
threads kept busy before (compiler threads on a core nobody else wanted delay nobody; on cores the
application uses they take its turns), and the safepoints of the start, the look and the stop.
That, as a share of the window, against what the budget leaves; the JVM's whole CPU time is said
beside it. The old objects' paths to GC roots are searched when the recording stops, in a
safepoint (the target is paused): that search gets a cutoff of the pause allowed (--max-pause),
within what the budget leaves after the rest. While it runs, what the application paid is
measured (probes/jvm/meter.py) and enforced."""

from __future__ import annotations

import math
import os
from pathlib import Path

from memdiag.system.hsperfdata import read_perfdata
from memdiag.system.jvm import JvmCounters, jvm_counters
from memdiag.system.target import Target

from ..face import Budget, Context, Plan
from .attach import AttachRefused, Jvm, catches_sigquit, describe_target, listener_running
from .costs import Price, price
from .tool import Tool, feature_of, trusted_jfr

MIN_CUTOFF_MS = 10  # below this the search of paths to GC roots is not worth a safepoint
DEFAULT_CUTOFF_MS = 1000  # run alone (memdiag probe jfr): the pause memdiag allows by default
# JFR's own threads: once there, JFR has started in this JVM before and a new start is cheap
_JFR_THREADS = ("JFR Recorder Th", "JFR Periodic Ta")


class JfrPlan(Plan):
    """The decision, and what the run needs of it."""

    jvm: Jvm | None = None
    tool: Tool | None = None  # the host's jfr tool memdiag trusts, to read the recording
    build: str | None = None  # the JVM's version (java.vm.version): what its costs are kept by
    cold: bool = True
    price: Price | None = None
    cutoff_ms: int = 0
    allowance_ns: float | None = None  # what the budget leaves it, as the plan priced it (None: no budget)
    share: float = 1.0  # of the JVM's CPU for the recording, the share priced as the application's


def jfr_started_before(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """JFR's threads run in the JVM (an earlier recording started them; they stay)."""
    try:
        tids = os.listdir(proc_root / str(pid) / "task")
    except OSError:
        return False
    for tid in tids:
        try:
            comm = (proc_root / str(pid) / "task" / tid / "comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith(_JFR_THREADS):
            return True
    return False


def pays(pid: int, cost: Price, share: float, seconds: float, budget: Budget) -> str:
    """The command that pays for the recording: the budget it needs over this window, and the
    window it needs at this budget (its price is mostly the start's, paid once: a longer window
    spreads it), each rounded up to what a person types. A recording over more of the window is
    priced at what this one would have been: the difference is its per-second rate, a few ms."""
    need_s = cost.app_s(seconds, share) + MIN_CUTOFF_MS / 1000
    percent = math.ceil(200 * need_s / budget.window_s) / 2  # to half a percent, up
    command = f"`memdiag --pid {pid} --budget {percent:g}`"
    per_s = budget.percent / 100 - cost.record_per_s * share  # what each second of window adds to what it may spend
    if per_s > 0:
        window = max(budget.window_s, (cost.app_s(0.0, share) + MIN_CUTOFF_MS / 1000) / per_s)
        command += f" (or `--duration {math.ceil(window / 10) * 10:.0f}` at --budget {budget.percent:g})"
    return command


def _over_budget(command: str) -> dict:
    """What the rules see of a plan over the budget (its figures are in the trail, with their parts)."""
    why = f"its price is over the budget (the trail says by how much): {command} pays for it"
    return {"jfr.plan": "over-budget", "jfr.not_run": why, "jfr.pays": command}


def _refused(reason: str) -> JfrPlan:
    return JfrPlan(go=False, state="refused", reason=reason, facts={"jfr.plan": "refused", "jfr.not_run": reason})


def attachable(target: Target, one_process: str) -> tuple[Jvm, JvmCounters | None] | str:
    """The JVM and its counters, if memdiag may send it commands; else why not (nothing sent).
    one_process: what to say of a target that is not one process."""
    if target.kind != "pid" or target.pid is None:
        return one_process
    pid = target.pid
    try:
        jvm = describe_target(pid)
    except AttachRefused as e:
        return str(e)
    if not listener_running(jvm) and not catches_sigquit(jvm):
        return (
            "the JVM does not catch SIGQUIT (-Xrs or -XX:+ReduceSignalUsage) and has no attach socket: a signal "
            "would end it, so none is sent"
        )
    return jvm, read_counters(pid)


def read_counters(pid: int) -> JvmCounters | None:
    """The JVM's counters now (its hsperfdata file); None where it keeps none."""
    perf = read_perfdata(pid)
    return jvm_counters(perf) if perf is not None else None


def plan(target: Target, ctx: Context) -> JfrPlan:
    """The recording's plan for ctx.seconds (never raises; a refusal says why)."""
    found = attachable(
        target, "the flight recorder is a JVM's own: it records one process (--pid, or a container's JVM)"
    )
    if isinstance(found, str):
        return _refused(found)
    jvm, counters = found
    tool, how = trusted_jfr(feature_of(counters.spec_version) if counters else None)
    if tool is None:  # the JVM may be attached to: the class histograms still name the class (the playbook)
        return JfrPlan(
            go=False, state="refused", reason=how, facts={"jfr.plan": "no-tool", "jfr.not_run": how, "jfr.pays": how}
        )
    build = counters.version if counters else None
    cold = not jfr_started_before(target.pid)
    cost = price(build, cold)
    return _priced(ctx, jvm, tool, build, cold, cost, cpu_share(target.pid, ctx.cpu_rate))


def cpu_share(pid: int, rate: float | None) -> tuple[float, str]:
    """Of the CPUs the target may run on, the share it kept busy before (its CPU rate over the window
    so far), and how that reads; 1 where its rate is unknown: all of the JVM's CPU is then priced as
    the application's. A CPU quota of its cgroup is not read: its rate against the host's CPUs."""
    try:
        cpus = len(os.sched_getaffinity(pid))
    except OSError:
        cpus = os.cpu_count() or 1
    if rate is None:
        return 1.0, "all of it, its CPU rate before being unknown"
    share = min(1.0, max(0.0, rate / cpus))
    return share, f"{share:.0%} of it, the share of its {cpus} CPUs the JVM kept busy before ({rate:.2f} CPUs)"


def _priced(
    ctx: Context, jvm: Jvm, tool: Tool, build: str | None, cold: bool, cost: Price, share: tuple[float, str]
) -> JfrPlan:
    total_ns = cost.app_s(ctx.seconds, share[0]) * 1e9
    cpu_s = cost.cpu_s(ctx.seconds)
    start = (
        "its first start in this JVM (JFR compiles its own code)" if cold else "a start (JFR ran in this JVM before)"
    )
    source = (
        "as measured on this JVM build here" if cost.measured_here else "an estimate measured on OpenJDK 17 elsewhere"
    )
    what = (
        f"a flight recording: what the application would pay, {total_ns / 1e6:.0f} ms: of the JVM's CPU for it, "
        f"{cpu_s * 1000:.0f} ms ({start} {cost.start_s * 1000:.0f} ms, {cost.record_per_s * 1000:.1f} ms per second "
        f"for the {ctx.seconds:.0f} s it would record, {cost.stop_s * 1000:.0f} ms to stop and as much for its first "
        f"look), {share[1]}, and {cost.pauses_s * 1000:.0f} ms of safepoints "
        f"({source})"
    )
    common = dict(jvm=jvm, tool=tool, build=build, cold=cold, price=cost, share=share[0])
    budget = ctx.budget
    allowed_ms = ctx.options.get("budget_ms")
    if allowed_ms and ctx.seconds > 0:  # memdiag probe jfr --budget-ms: what the user allows it, in the target's time
        budget = Budget(percent=100 * allowed_ms / 1000 / ctx.seconds, window_s=ctx.seconds)
    if budget is None:  # run alone: no budget to answer to
        cutoff = int(ctx.max_pause_ms or DEFAULT_CUTOFF_MS)
        return JfrPlan(go=True, state="full", reason=what, facts={"jfr.plan": "full"}, cutoff_ms=cutoff, **common)
    percent = 100 * total_ns / (budget.window_s * 1e9)
    estimate = dict(estimated_percent=percent, estimate_of="the flight recording (start, recording, stop)")
    left_ns = budget.allowance_ns - total_ns
    if left_ns < MIN_CUTOFF_MS * 1e6:  # without time to search the paths to GC roots, no holder is named
        command = pays(jvm.pid, cost, share[0], ctx.seconds, budget)
        reason = (
            f"{what} = {percent:.2f}% of the {budget.window_s:.0f} s window, leaving "
            f"{max(left_ns, 0) / 1e6:.0f} ms of the {budget.percent:g}% budget for the search of paths to GC roots "
            f"(at least {MIN_CUTOFF_MS} ms): the counters say where the heap grows; the allocating method and the "
            f"holder need {command}"
        )
        return JfrPlan(
            go=False,
            state="over-budget",
            reason=reason,
            facts=_over_budget(command),
            **estimate,
            **common,
        )
    cutoff = int(min(ctx.max_pause_ms if ctx.max_pause_ms is not None else DEFAULT_CUTOFF_MS, left_ns / 1e6))
    reason = (
        f"{what} = {percent:.2f}% of the {budget.window_s:.0f} s window <= budget {budget.percent:g}%; paths to GC "
        f"roots searched within {cutoff} ms"
    )
    return JfrPlan(
        go=True,
        state="full",
        reason=reason,
        facts={"jfr.plan": "full"},
        cutoff_ms=cutoff,
        allowance_ns=budget.allowance_ns,
        **estimate,
        **common,
    )
