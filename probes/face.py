"""The face of a probe: everything one probe adds to a diagnosis, declared in one place beside its
loader. The rule catalog (rules/catalog.py), the fact set (diagnose/factset.py), the engine and
the report read faces through the registry (probes/registry.py) and name no probe.

A probe is something that observes the target at a price: a BPF program with its loader
(bpf/NAME.c + probes/NAME.py), or a reader of a runtime's own instruments (a JVM's perf counters,
its flight recorder driven through the attach socket, an interpreter's frames read from its memory,
Go's heap profile buckets). Both have the same face: a probe that loads no BPF is registered with
`bpf=False`, its run() does whatever observing it needs (read a file, send a command, read memory)
and returns a ProbeResult like any other.

Adding a probe
--------------
1. Its module, probes/NAME.py (or a package probes/NAME/), defines `FACE = Face(name="NAME", ...)`.
2. One entry in probes/registry.py: `ProbeSpec("NAME")`; `module=` when the module is not
   memdiag.probes.NAME, `options=` for its BPF program's compile options, `bpf=False` when it loads
   no BPF program (`memdiag prepare` compiles nothing for it), `host_wide=True` when its program
   runs for every process of the host and filters the target inside.
3. Playbook rules that ask for it (`probes: [{name: NAME}]`) and read its facts.
4. An example result in tests/unit/test_conformance.py: the test checks its facts against the
   catalog and renders its rows, stacks and sections in Markdown, JSON and HTML.
Nothing in diagnose/ or rules/ changes.

The face, field by field (only `name` and `run` are required)
---------------------------------------------------------------
name       the registry's name: what rules ask for and what the probe table's row is called.
summary    one line saying what it observes, for `memdiag probe --help` and the man page.
needs      needs(target kind, options) -> why `memdiag probe NAME` cannot run on a target of this kind
           ("pid", "cgroup", "system") with these options (a usage error, exit 2), or None; pid_only(why)
           for a probe of one process. In a diagnosis it returns "unavailable" with its reason instead.
run        run(target, ctx) -> ProbeResult (a subclass: the probe's own typed result). ctx.seconds
           is how long it may observe; ctx.plan its own plan when it made one; ctx.budget the
           budget's ledger (allowance_ns: what is left of the target's time; `memdiag probe`: the
           default budget over its own run); ctx.max_pause_ms the longest stop of the target
           allowed; ctx.cpu_rate the target's CPU rate before any probe; ctx.alone and ctx.options
           (its own `options`' values, and --top) when `memdiag probe NAME` runs it. A probe that
           cannot run returns status "unavailable" with the reason, never raises; it leaves nothing
           running in the target (a recording it started is stopped, a stopped thread resumed).
result     the type run() returns (a ProbeResult subclass): what facts_of, rows, stacks ... receive.
describe   describe(result, top) -> lines for `memdiag probe NAME` under the common header.
facts      its catalog entries, FactDef(name, kind, help): the facts it yields, each under the
           namespace of its own (faults.*, jvm.*); rules may name only facts of the catalog.
retired    (fact, why) of facts it yielded once: a rule naming one is told what decides now.
facts_of   facts_of(result | None, plan | None, name) -> {fact: value}: computed from its result
           (None: it did not run) and its plan; only facts it declared; None for unknown. `name`
           names a stack's culprit function (name(frames, forwards) -> str | None): the playbook's
           wrappers list, passed in by the diagnosis.
rows       rows(result | None, plan | None, RowContext) -> [ProbeStatus]: its rows of the probe
           table. Default: [ctx.row], the row every probe has, from the result's common fields (or
           "not-run" and why: the trail's reason, or its plan's when that did not go).
stacks     Stacks(kind, shown, of, folded, culprit, ...): its stacks as the one Stack type (frames in
           the probe's own language: native symbols, or Java methods with their lines; a frame not
           of the native "fn+0x1a [module]" form is matched whole against the playbook's wrappers).
           kind "allocations" (what is held: outstanding blocks, a heap's live objects) comes before
           "events" (page faults, calls) in the report and when the verdict's stack is chosen;
           culprit(result, verdict kind) picks the stack a verdict rests on (default: the heaviest).
           space, counted and folded_by name its bytes and counts as pprof's sample types
           (inuse_space/inuse_objects, space/faults ...) for the report's profile.pb.gz files.
caveats    caveats(result) -> sentences for the report's Caveats.
sections   sections(result) -> [Section]: report sections of its own ("Java heap"): a title, lines
           and an optional table, rendered in Markdown and HTML and kept in report.json.
trail      trail(result) -> [TrailItem]: steps of its own after its run's line (a scan it ran).
missed     missed(result) -> what an interrupted run did not gather beyond its own time.
measured   measured(result) -> TracingCost | None: what it cost the target, measured on the target
           (its CPU time, its traps); None: its cost is its BPF run time (Cost.bpf_run_ns).
on_target  its row's overhead is measured on the target, not its BPF run time (ProbeStatus.on_target).
plan       plan(target, ctx) -> Plan | None, before it runs: its price against ctx.budget for
           ctx.seconds. None (the field, or the answer): cheap, just run it. A Plan (subclass it with
           what its run needs: memleak's carries the host's trap costs, the call rates and a
           Schedule of N bursts of L seconds) is in the trail; what it `spent` (a count) is in the
           ledger and a row of the table each; its `facts` are shown to the rules; one that does
           not `go` is not run, and what the rules then ask for runs in its place.
planning   what plan() does, in words, for the phase a signal may interrupt.
options    Option(...): `memdiag probe NAME`'s arguments of its own; their values in ctx.options. In a
           diagnosis, a rule gives them from facts (`given: {function: faults.top_function}`).
refuse     refuse(options) -> str | None: a usage error among its options' values (exit 2).
keep       keep(older, newer) -> the result that speaks for a long window watched in cycles, where
           the probe runs once per cycle (diagnose/cycles.py); None: the newest. memleak keeps the
           run whose scan found the most leaked bytes: a leak seen at night is not forgotten by day.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from memdiag.system._parse import Model
from memdiag.system.target import Target
from memdiag.system.units import Kind
from pydantic import ConfigDict

ProbeState = Literal["ok", "partial", "unavailable", "error"]
RowState = Literal["ok", "partial", "unavailable", "error", "not-run"]


class _Frozen(Model):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- what every probe's result has ------------------------------------------------------------


class Cost(Model):
    events: int = 0
    bpf_run_ns: int | None = None  # None: kernel.bpf_stats_enabled not available (or no BPF)
    bpf_run_count: int | None = None
    map_bytes: int | None = None  # kernel memory held by the probe's maps (fdinfo memlock)


class ProbeResult(Model):
    """Fields every probe reports; each probe's result adds its own data."""

    name: str
    status: ProbeState
    reason: str = ""
    method: str = ""
    target: str = ""
    started: float = 0.0
    attached: float | None = None  # the wall clock once everything was attached (its series count from it)
    duration_s: float = 0.0
    target_exited_at: float | None = None
    target_execd_at: float | None = None  # the target exec'd another program then (system/identity.py)
    target_exec: str | None = None  # the program it exec'd
    interrupted: bool = False
    backed_off: bool = False  # stopped early because it cost more than allowed
    detach_s: float | None = None  # how long detaching its programs took (each probe waits out a grace period)
    lost: dict[str, int] = {}
    cost: Cost = Cost()


class TracingCost(Model):
    """What a probe cost the target, measured on the target, from the attach to now (or the detach)."""

    attached_s: float
    probes_ns: float | None = None  # each program's hits x its site's trap + the programs' run time
    cpu_ns: float | None = None  # the target's CPU time above its rate before the attach
    measured_ns: float | None = None  # what is reported and enforced: the probes' count, raised by
    # the CPU clock's up to twice it, unless `measure` says otherwise
    measure: str | None = None  # what measured_ns is when it is another measure (cpu_ns then beside it)

    def percent_of(self, window_s: float) -> float | None:
        return None if self.measured_ns is None or window_s <= 0 else 100 * self.measured_ns / (window_s * 1e9)


# --- facts ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FactDef:
    """One fact of the catalog: its name, its kind of unit, what it means. A probe's numeric facts
    are figures of its row of the probe table (`row`: another of its rows; figure=False: none)."""

    name: str
    kind: Kind
    help: str
    row: str | None = None
    figure: bool = True


Namer = Callable[[list[str], list[bool]], str | None]  # (frames, forwards) -> the culprit's function


# --- what the report shows of a probe ------------------------------------------------------------


class StackReach(_Frozen):
    """One stack's outstanding blocks, by what still points at them (memleak's reachability scan;
    on a garbage-collected heap everything live is anchored, by the field or global that holds it)."""

    leaked_count: int = 0
    leaked_bytes: int = 0
    unreferenced_count: int = 0  # leaked, and no other block points at them either
    anchored_count: int = 0
    anchored_bytes: int = 0
    anchor: str | None = None  # the root that holds most of the anchored bytes
    anchor_kind: str | None = None  # static | stack | register | tls | untracked | runtime (a global it names)
    anchor_bytes: int = 0


class Stack(_Frozen):
    """One stack as the report and the culprit read it, the same for every probe: frames leaf
    first, as the probe names them ("fn+0x1a [module]", "[unknown] [module]", or a language's own:
    "OrderService.processBatch(int) line: 10"), and what it accounts for."""

    frames: list[str]
    functions: list[str | None] = []  # the frames' function names, None where unknown
    forwards: list[bool] = []  # per frame: its code only forwards an allocation (a wrapper)
    bytes: int
    count: int = 0
    pid: int | None = None
    detail: str = ""  # what it accounts for, in words: "989 page faults", "12 allocations outstanding ..."
    series: list[int] = []  # bytes over the probe's run, when sampled
    series_s: list[float] = []  # when each was sampled: seconds since the probe attached
    reach: StackReach | None = None  # what still points at its blocks, when a scan said
    # its frames stand for several call paths merged, chosen by a count that samples them unfairly
    # (a CPython target's arenas: the line that mapped the most): a culprit only where no probe's
    # stack that counts by bytes (an event stack: the page faults first touching them) ran
    sampled: bool = False


@dataclass(frozen=True)
class Stacks:
    """How a probe's stacks enter the report: allocation stacks (outstanding blocks) before event
    stacks (counted page faults, calls), each kind in the registry's order, for the stacks shown,
    the flame graph (the first probe with folded lines) and the culprit."""

    kind: Literal["allocations", "events"]
    shown: int  # how many the report lists
    of: Callable[[Any], list[Stack]]  # the result's stacks, heaviest first
    folded: Callable[[Any], list[str]]  # its folded stacks ("frame;frame count"), the flame graph's input
    # the stack a verdict of this kind (leak, growth, ...) rests on; default: the heaviest, any kind
    culprit: Callable[[Any, str], Stack | None] | None = None
    # what Stack.bytes and Stack.count are in pprof's terms, the sample types of its profile
    # (diagnose/render/pprof.py), unit bytes and count: held at the end (inuse_space, inuse_objects)
    # or what events asked for (space; faults, brk_calls); space None: its bytes are not measured
    space: str | None = "space"
    counted: str = "events"
    folded_by: Literal["bytes", "count"] = "bytes"  # which of the two its folded lines weigh

    def culprit_of(self, result: Any, verdict_kind: str) -> Stack | None:
        if self.culprit is not None:
            return self.culprit(result, verdict_kind)
        stacks = self.of(result)
        return stacks[0] if stacks else None


class Section(_Frozen):
    """A part of the report's evidence a probe adds under a heading of its own ("Java heap"): lines
    (one bullet each) and an optional table. Plain text: the renderers escape it."""

    probe: str
    title: str
    lines: list[str] = []
    header: list[str] = []
    rows: list[list[str]] = []


class ProbeStatus(_Frozen):
    """One row of the probe table."""

    name: str
    status: RowState
    reason: str
    method: str | None = None
    duration_s: float | None = None
    started: float | None = None  # the wall clock when its run began (loading), None: not run
    attached: float | None = None  # when everything was attached: it traced from then for duration_s
    events: int | None = None
    overhead_percent: float | None = None  # measured: what it cost the target over the window
    map_bytes: int | None = None  # kernel memory its BPF maps held
    lost: dict[str, int] = {}  # what it could not record, by cause (nonzero only)
    figures: dict[str, float] = {}  # the facts it gave the rules (name -> value in the catalog's unit)
    on_target: bool = False  # its overhead was measured on the target (CPU time, traps, a pause), not BPF time
    reads: bool = False  # it loads no BPF: its overhead is memdiag's time reading the target's memory or maps
    host_wide: bool = False  # its BPF program runs for every process of the host and filters the target inside
    stacks: Literal["allocations", "events"] | None = None  # what its stacks are (Stacks.kind); None: it has none


class TrailItem(_Frozen):
    """One step of what the engine did and why: a rule's outcome, a budget decision, a probe run."""

    kind: Literal["rule", "probe", "budget", "scan"]
    name: str
    state: str
    reason: str
    source: str = ""
    at_s: float = 0.0


@dataclass(frozen=True)
class RowContext:
    """What a probe's rows need beyond its result: the window, the figures by row, and the row every
    probe has (run or not, and why not), which its own rows() returns among its rows."""

    window_s: float
    figures: Mapping[str, dict[str, float]]
    row: ProbeStatus


# --- asking a probe to plan and run ----------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    """The budget's ledger as a probe sees it: a share of the window, less what was spent already."""

    percent: float
    window_s: float
    spent_ns: float = 0.0  # the target's time one-off steps (a rate count) took already

    @property
    def allowance_ns(self) -> float:
        """What the budget leaves of the window, in ns of the target's time."""
        return max(0.0, self.percent / 100 * self.window_s * 1e9 - self.spent_ns)


class Spent(_Frozen):
    """A one-off step a plan took that cost the target (a rate count): a row of the probe table,
    before every probe's own."""

    step: str
    seconds: float
    ns: float
    events: int
    reason: str
    method: str


class Plan(Model):
    """What a probe's plan() decided before it runs. A probe's own plan subclasses it with what its
    run needs (memleak: the host's trap costs, the call rates, how many bursts of how long)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    go: bool  # run it
    state: str  # the decision in a word, as the trail shows it: full, fallback, unknown, ...
    reason: str
    facts: dict[str, Any] = {}  # what the rules see of the decision (facts the probe declared)
    estimated_percent: float | None = None  # its projected cost, as a share of the window
    estimate_of: str | None = None  # what was estimated, for the Overhead section
    spent: list[Spent] = []  # what planning cost the target

    @property
    def spent_ns(self) -> float:
        return sum(s.ns for s in self.spent)


@dataclass(frozen=True)
class Context:
    """What the engine (or `memdiag probe`) tells a probe when it asks it to plan or to run."""

    seconds: float  # how long it would run (plan) or runs (run)
    budget: Budget | None = None  # None: run alone, no budget
    plan: Plan | None = None  # run: its own plan, when it made one
    max_pause_ms: float | None = None  # the longest stop of the target allowed (None: no limit)
    cpu_rate: float | None = None  # the target's CPU seconds per second before any probe (None: unknown)
    runtime_mark: Any = None  # its runtime's counters at the window's start (RuntimeFace.mark), if it has one
    # its own options' values: `memdiag probe`'s, or in a diagnosis what the asking rule gave from facts
    options: Mapping[str, Any] = field(default_factory=dict)
    alone: bool = False  # run by `memdiag probe NAME`, not by a diagnosis


@dataclass(frozen=True)
class Option:
    """One argument of `memdiag probe NAME` of the probe's own: --flag VALUE into ctx.options[dest]."""

    flag: str
    kind: Literal["count", "size", "milliseconds", "flag", "function", "pattern"]
    help: str
    default: Any = None
    group: str = ""  # the heading it is listed under (default: the probe's name)

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _none(*_args) -> list:
    return []


def _no_facts(_result, _plan, _name) -> dict:
    return {}


@dataclass(frozen=True)
class Face:
    """A probe's whole face (see the module's docstring for each field)."""

    name: str
    run: Callable[[Target, Context], ProbeResult]
    summary: str = ""
    needs: Callable[[str, Mapping[str, Any]], str | None] = lambda _kind, _o: None
    result: type[ProbeResult] = ProbeResult
    describe: Callable[[Any, int], list[str]] = _none
    facts: tuple[FactDef, ...] = ()
    retired: tuple[tuple[str, str], ...] = ()  # (fact it yielded once, what decides now)
    facts_of: Callable[[Any, Plan | None, Namer], dict] = _no_facts
    rows: Callable[[Any, Plan | None, RowContext], list[ProbeStatus]] | None = None
    stacks: Stacks | None = None
    caveats: Callable[[Any], list[str]] = _none
    sections: Callable[[Any], list[Section]] = _none
    trail: Callable[[Any], list[TrailItem]] = _none
    missed: Callable[[Any], list[str]] = _none
    measured: Callable[[Any], TracingCost | None] = lambda _r: None
    on_target: bool = False
    plan: Callable[[Target, Context], Plan | None] | None = None
    planning: str = ""
    options: tuple[Option, ...] = ()
    refuse: Callable[[Mapping[str, Any]], str | None] = lambda _o: None
    keep: Callable[[Any, Any], Any] | None = None

    def table(
        self, result: ProbeResult | None, plan: Plan | None, window_s: float, figures: Mapping, not_run: str
    ) -> list[ProbeStatus]:
        """Its rows of the probe table: its own rows(), or the one row every probe has."""
        row = probe_row(self, result, window_s, figures, not_run, plan)
        if self.rows is None:
            return [row]
        return self.rows(result, plan, RowContext(window_s, figures, row))

    def fact_names(self) -> set[str]:
        return {f.name for f in self.facts}


def pid_only(why: str) -> Callable[[str, Mapping[str, Any]], str | None]:
    """The face's needs for a probe of one process: why, for any other target."""
    return lambda kind, _o: None if kind == "pid" else why


def plain(run: Callable[[Target, float], ProbeResult]) -> Callable[[Target, Context], ProbeResult]:
    """The face's run for a loader whose run(target, seconds) takes nothing else."""
    return lambda target, ctx: run(target, ctx.seconds)


# --- the one row every probe has ----------------------------------------------------------------


def percent_of_window(ns: float | None, window_s: float) -> float | None:
    """The target's time (ns) as a share of the window; None stays None (not measured)."""
    return None if ns is None or window_s <= 0 else 100 * ns / (window_s * 1e9)


def overhead_percent(face: Face, r: ProbeResult, window_s: float) -> float | None:
    """What a probe cost the target over the whole window: measured on the target where the probe
    measures it (face.measured), else its BPF run time (tracepoints trap nothing)."""
    if window_s <= 0:
        return None
    measured = face.measured(r)
    if measured is not None and measured.measured_ns is not None:
        return measured.percent_of(window_s)
    if r.cost.events == 0 and not r.cost.bpf_run_ns:
        return 0.0 if r.status in ("ok", "partial") else None
    return percent_of_window(r.cost.bpf_run_ns, window_s)  # None: the kernel kept no run time, not free


def row_reason(r: ProbeResult) -> str:
    """The probe's reason; "see lost" only where the lost figures are (the probe table's column)."""
    reason = r.reason or "ran"
    return reason if any(r.lost.values()) else reason.replace(" (see lost)", "")


def probe_row(
    face: Face, r: ProbeResult | None, window_s: float, figures: Mapping, not_run: str, plan: Plan | None = None
) -> ProbeStatus:
    """The row of a probe from its result's common fields, or why it did not run (its plan's
    reason when the plan did not go, else not_run: the trail's)."""
    if r is None:  # what its plan gave the rules stands in its row (its price, when it priced itself out)
        why = f"not attached: {plan.reason}" if plan is not None and not plan.go else not_run
        return ProbeStatus(name=face.name, status="not-run", reason=why, figures=figures.get(face.name, {}))
    return ProbeStatus(
        name=face.name,
        status=r.status,
        reason=row_reason(r),
        method=r.method,
        duration_s=r.duration_s,
        started=r.started or None,
        attached=r.attached,
        events=r.cost.events,
        overhead_percent=overhead_percent(face, r, window_s),
        map_bytes=r.cost.map_bytes,
        lost={k: v for k, v in r.lost.items() if v},
        figures=figures.get(face.name, {}),
        on_target=face.on_target,
    )
