"""The data of one diagnosis: target, verdict, findings, probes, overhead and the counters behind
them. Renderers take a Report and write it; report.json is this model dumped. The probe table's
rows, the trail's steps and the probes' sections are the probes' own types (probes/face.py)."""

from __future__ import annotations

from typing import Any, Literal, get_args

from memdiag.probes.face import ProbeStatus, Section, StackReach, TrailItem
from memdiag.probes.registry import REGISTRY
from memdiag.system._parse import Model
from memdiag.system.container import ContainerInfo, PodInfo
from memdiag.system.kmsg import OomKill
from memdiag.system.ledger import AnonSplit
from memdiag.system.sysvshm import ShmSegment
from memdiag.system.trends import Trend
from pydantic import ConfigDict, Field, model_validator

VerdictKind = Literal["leak", "cache", "growth", "pressure", "oom", "healthy", "inconclusive"]


class _Model(Model):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TargetInfo(_Model):
    kind: Literal["pid", "cgroup", "system"]
    description: str
    pid: int | None = None
    comm: str | None = None
    cmdline: list[str] = []
    cgroup: str | None = None
    cgroup_version: int | None = None
    container: ContainerInfo | None = None  # the container the target is or runs in
    pod: PodInfo | None = None  # the Kubernetes pod the target is
    runtime: str | None = None  # target.runtime: a runtime of probes/registry.py RUNTIMES, none (native), unknown
    runtime_detail: str | None = None  # its version and module: Go 1.19.8 (/usr/bin/prometheus; ...)


class Culprit(_Model):
    pid: int | None = None
    comm: str | None = None
    cgroup: str | None = None
    stack: list[str] = []  # the whole stack, leaf first
    # the first frame a user should read (diagnose/culprit.py), and what every frame is: allocator,
    # wrapper, guessed-wrapper, runtime, unknown (passed over), culprit or interpreter (named), caller
    function: str | None = None
    source: str | None = None  # the culprit frame's file:line (its DWARF line table's, Go's function table's)
    clone: str | None = None  # the compiler's clone suffix of the function's symbol (".isra.0"), a detail
    frame_kinds: list[str] = []
    guessed: bool = False  # a wrapper was passed over from its code alone (not the playbook's list)


class Verdict(_Model):
    kind: VerdictKind
    summary: str
    confidence: float = Field(ge=0.0, le=1.0)
    culprit: Culprit = Culprit()
    rule: str | None = None  # the playbook rule that concluded (None: no rule did)
    because: list[str] = []  # the rules whose findings the summary quotes, those that fired


class Interrupted(_Model):
    """A SIGINT or SIGTERM ended the diagnosis early: the report is partial."""

    signal: str  # SIGINT, SIGTERM
    phase: str  # what memdiag was doing when it came
    at_s: float  # seconds into the diagnosis
    not_gathered: list[str] = []  # what the window would have gathered and did not


class Finding(_Model):
    id: str
    summary: str
    evidence: dict[str, Any] = {}


class StackReport(_Model):
    """A stack the verdict rests on, with what it accounts for."""

    probe: str
    frames: list[str]
    bytes: int
    count: int = 0  # what it counts, as its probe's Stacks.counted says: outstanding blocks, page faults ...
    detail: str  # "2,040 allocations outstanding, 0 frees" / "989 page faults" ...
    series: list[int] = []  # outstanding bytes over time (memleak)
    series_s: list[float] = []  # when each was sampled: seconds since its probe attached (the probe's row says when)
    frame_kinds: list[str] = []  # as Culprit.frame_kinds: which frames were passed over when naming it
    reach: StackReach | None = None  # leaked / anchored at the reachability scan (memleak)


class Overhead(_Model):
    """Percentages are of one CPU's time over the window (window_s)."""

    budget_percent: float
    estimated_percent: float | None = None  # the budget decision's projection, before attaching
    estimate_of: str | None = None  # what was estimated (and whether it was attached)
    measured_percent: float | None = None  # the probe table's overhead column, summed
    tracing_probes_percent: float | None = None  # memleak: its probes' hits x trap + BPF run time
    tracing_cpu_percent: float | None = None  # memleak: the target's CPU time above its rate before
    window_s: float | None = None
    # a probe measured another way (a flight recording: what the application paid), with the
    # target's CPU time above its rate beside it: (probe, what it measures, its percent, the CPU's)
    measured_otherwise: list[tuple[str, str, float | None, float | None]] = []


Scope = Literal["process", "cgroup", "system", "runtime"]
_SCOPES = get_args(Scope)


class CounterRow(_Model):
    """One line of the evidence table. Values in the unit named; None = unknown."""

    scope: Scope  # runtime: the target's runtime's own counters
    name: str
    unit: Literal["bytes", "count", "percent", "per_s", "bytes_per_s", "pages_per_s"]
    first: float | None = None
    last: float | None = None
    rate_per_s: float | None = None


class SlabGrowth(_Model):
    name: str
    first_bytes: int
    last_bytes: int


class LedgerRow(_Model):
    """One line of a ledger over the window: its bytes at the first and last sample and at each
    (series), None where the source does not say (system/ledger.py)."""

    key: str
    label: str
    summed: bool = True  # a part of the total; False: a figure beside it (working set, page tables)
    first: int | None = None
    last: int | None = None
    series: list[int] = []
    shape: str = "unknown"  # climbing, levelled, flat, ... as the trends say it
    estimate: bool = False
    parts: list[tuple[str, int]] = []  # its detail at the window's end, largest first

    @property
    def growth(self) -> int | None:
        return self.last - self.first if self.first is not None and self.last is not None else None


class LedgerReport(_Model):
    """A total (a process's RSS, a cgroup's usage, the host's MemTotal) and the lines it is made of,
    the residual a line of its own, at the window's start and end."""

    scope: Literal["process", "cgroup", "host"]
    subject: str  # PID 123 (orderd), cgroup /x, the host
    total_label: str
    total_first: int | None = None
    total_last: int | None = None
    rows: list[LedgerRow] = []
    counts_first: dict[str, int] = {}  # descriptors by type (a process)
    counts_last: dict[str, int] = {}
    unknown: list[str] = []  # lines its source does not give (v1's kernel memory by kind)
    # the rows' detail (parts) is read once as the window closes, after the last sample: when
    # (seconds into the window) and the lines' own values then ("total" and line keys)
    detail_at_s: float | None = None
    detail_totals: dict[str, int | None] = {}
    anon_split: AnonSplit | None = None  # a process's anonymous memory by who holds it, read with the detail

    @property
    def total_growth(self) -> int | None:
        a, b = self.total_first, self.total_last
        return b - a if a is not None and b is not None else None

    def row(self, key: str) -> LedgerRow | None:
        return next((r for r in self.rows if r.key == key), None)


class ShmFiles(_Model):
    """One tmpfs mount at the window's start and end, with the file patterns that grew most."""

    mount_point: str
    used_first: int | None = None
    used_last: int
    size: int | None = None
    patterns: list[tuple[str, int, int, int, int]] = []  # (pattern, files first, files last, bytes first, bytes last)
    files_last: int = 0
    partial: bool = False


class Window(_Model):
    started: float  # seconds since the epoch
    ended: float
    requested_s: float
    samples: int
    target_exited_at: float | None = None
    target_pid_reused: bool = False  # it exited and another process already held its pid when seen
    target_execd_at: float | None = None  # it exec'd another program then: the window ended there
    target_exec: str | None = None  # the program it exec'd
    thinned: int = 0  # samples dropped to keep a long window's memory bounded, all before thinned_before_s
    thinned_before_s: float | None = None


class ProcessRow(_Model):
    """A process of the target's scope that a list of the report names (largest, fastest growing,
    paying in major faults): the lists quote these figures and nothing else."""

    pid: int
    comm: str
    rss_first: int | None = None  # None: it started during the window
    rss_last: int | None = None
    majflt_delta: int | None = None
    ns_pid: int | None = None  # the pid inside its own pid namespace (a container's); None: unknown

    @property
    def growth(self) -> int:
        return (self.rss_last or 0) - (self.rss_first or 0)


# the target's own memory series, as the Trends table names them (a process's RSS, a cgroup's usage):
# whose shape says whether the target grows
TARGET_SERIES = ("process.rss", "cgroup.usage")


class Counters(_Model):
    runtime: str | None = None  # the display name of the target's runtime, whose counters are scope "runtime"
    labels: dict[str, str] = {}  # the runtime's rows and series -> how the report names them
    rows: list[CounterRow] = []
    trends: dict[str, Trend] = {}
    series: dict[str, list[tuple[float, float]]] = {}  # name -> [(seconds into window, value)]
    oom_kills: list[OomKill] = []
    slab_top: list[SlabGrowth] = []
    processes: list[ProcessRow] = []  # the target's processes the lists name; never memdiag's own
    swap_devices: list[dict[str, Any]] = []
    ledgers: list[LedgerReport] = []  # the target's, its cgroup's and the host's (diagnose/ledgers.py)
    shm: list[ShmFiles] = []  # tmpfs mounts the target sees, largest first
    sysv: list[ShmSegment] = []  # System V segments the target's processes created in the window, still there
    oom_ledger: LedgerReport | None = None  # the OOM cgroup's usage at its latest kill, as the kernel reported it

    @model_validator(mode="before")
    @classmethod
    def _scoped_by_runtime_name(cls, data: Any) -> Any:
        """A report.json written before runtime faces scoped a runtime's rows by the runtime's name
        and labelled none of its series: read as the runtime scope, labelled by that runtime's face."""
        if not isinstance(data, dict) or "runtime" in data:
            return data
        named = {r.get("scope") for r in data.get("rows", []) if isinstance(r, dict)} - set(_SCOPES)
        face = next((f for name in named if (f := REGISTRY.runtime(name)) is not None), None)
        if face is None:
            return data
        rows = [{**r, "scope": "runtime"} if r.get("scope") == face.name else r for r in data["rows"]]
        return {**data, "rows": rows, "runtime": face.display, "labels": dict(face.labels)}


class StackComparison(_Model):
    """One stack of a verification (memdiag verify): an earlier culprit, fixed or still leaking, or
    a stack that grows now and did not before. Rates are outstanding bytes per second over each
    run's allocation tracing; leaked: blocks nothing pointed at, at that run's scan."""

    function: str | None
    signature: list[str] = []  # function names from the culprit frame up: how the stack was matched
    status: Literal["fixed", "still-leaking", "new-growth"]
    before_rate: float | None = None
    after_rate: float | None = None
    before_leaked: int | None = None
    after_leaked: int | None = None
    after_shape: str | None = None  # the stack's outstanding bytes in the new run: climbing, levelled, ...
    note: str = ""


class Verification(_Model):
    """An earlier report's culprits followed into a new diagnosis of the same service."""

    status: Literal["fixed", "still-leaking", "new-growth", "inconclusive"]
    summary: str
    baseline: str  # the earlier report's folder
    baseline_target: str
    baseline_verdict: str
    baseline_function: str | None = None
    found_by: str  # how the service was found again (its pid changed with the restart)
    stacks: list[StackComparison] = []
    rss_rate_before: float | None = None  # bytes/s over each whole window (the Trends table's rate)
    rss_rate_after: float | None = None
    window_before_s: float | None = None
    window_after_s: float | None = None


class CycleStack(_Model):
    """An allocation stack as one cycle of a long window saw it (diagnose/cycles.py)."""

    probe: str
    function: str | None
    bytes: int  # outstanding at the end of the cycle's trace
    leaked_bytes: int | None = None  # nothing pointed at them at the cycle's scan (None: no scan)
    leaked_count: int | None = None


class CycleRecord(_Model):
    """One cycle of a long window: when, the target's memory at its end, what its probes saw."""

    index: int
    start_s: float  # seconds into the window
    end_s: float
    memory: int | None = None  # the target's RSS (a cgroup's usage) at the cycle's end
    probes: list[str] = []  # the probes that ran in it
    stacks: list[CycleStack] = []


class Report(_Model):
    memdiag_version: str
    target: TargetInfo
    window: Window
    verdict: Verdict
    interrupted: Interrupted | None = None  # None: the diagnosis ran to its end
    findings: list[Finding] = []
    next_steps: list[str] = []
    caveats: list[str] = []
    probes: list[ProbeStatus] = []
    overhead: Overhead
    budget_decision: str | None = None
    trail: list[TrailItem] = []
    stacks: list[StackReport] = []
    sections: list[Section] = []  # the probes' own parts of the evidence ("Java heap")
    folded: list[str] = []  # memory-growth flame graph input (growth.folded)
    folded_probe: str | None = None  # the probe whose stacks they are (its Stacks.folded_by: bytes or a count)
    counters: Counters
    verification: Verification | None = None  # memdiag verify: the earlier report's culprits now
    cycles: list[CycleRecord] = []  # a long window's cycles (empty: a window watched in one go)
    interim: str | None = None  # a report written while the window still runs: how far it is

    @model_validator(mode="before")
    @classmethod
    def _probes_cost_said(cls, data: Any) -> Any:
        """A report.json written before its probe rows said how each probe's cost is measured (its
        reads, or a host-wide program's run time) and what its stacks are: said as the registry
        says of the probe."""
        if not isinstance(data, dict) or not isinstance(data.get("probes"), list):
            return data
        rows = []
        for row in data["probes"]:
            if isinstance(row, dict) and "reads" not in row and row.get("name") in REGISTRY.names:
                spec, face = REGISTRY.spec(row["name"]), REGISTRY.face(row["name"])
                kind = face.stacks.kind if face.stacks is not None else None
                row = {**row, "reads": not spec.bpf, "host_wide": spec.host_wide, "stacks": kind}
            rows.append(row)
        return {**data, "probes": rows}
