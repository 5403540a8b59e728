"""The diagnosis engine: counters -> rules -> probes -> findings -> rules again, within the window
and under the overhead budget, then the verdict the playbook reaches.

The counters are sampled for the whole window in a background thread. After a first stretch
(a third of the window, at least 5 s) the rules run on what the counters say; the probes they ask
for run one after another in the time left (probes are never run twice); their results become
facts and the rules run again, until nothing new is asked or the window is spent. Allocation
tracing (memleak) is priced first: a bounded count of allocator calls times the per-call cost
measured on this host; over budget, the playbook says what is traced instead (a rule on the
`alloc.tracing` fact), and memleak also detaches itself if what it really costs goes over.

Engine.run() returns one EngineResult; diagnose/assemble.py makes the Report of it."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Literal

from memdiag.probes import prepare
from memdiag.probes.base import INTERRUPTION, ProbeResult, ProbeTarget, interrupted, phase
from memdiag.probes.registry import REGISTRY
from memdiag.rules.engine import Outcome, conclude, run_rules, winner_of
from memdiag.rules.model import FrameClass, Rule
from memdiag.system.kmsg import read_oom_kills
from memdiag.system.process import cpu_seconds
from memdiag.system.processes import read_all_processes
from memdiag.system.runtime import read_runtime
from memdiag.system.units import fmt_duration
from pydantic import BaseModel, ConfigDict

from .culprit import Classes, default_classes
from .evidence import build_counters
from .factset import counter_facts, probe_facts, target_facts
from .observe import Observation, observe
from .report import Counters, Culprit, Interrupted, TrailItem, Verdict
from .snapshot import Snapshot
from .target import Target
from .triage import Triage, triage

FIRST_LOOK_SHARE = 0.3
FIRST_LOOK_MIN_S = 5.0
MIN_PROBE_S = 3.0


class BudgetDecision(BaseModel):
    choice: Literal["full", "fallback", "unknown"]
    reason: str
    estimated_percent: float | None = None  # share of the window, projected before attaching
    call_rate: float | None = None  # allocating calls (malloc, operator new, mallocx) per second
    cost_ns: float | None = None  # what tracing costs the target per malloc call, all sites together
    attached_percent: float | None = None  # share of a CPU while memleak is attached
    sites: str | None = None  # the price site by site

    def facts(self) -> dict:
        """What the rules see of it: `alloc.tracing` (full, fallback, unknown) says whether memleak
        attaches; the playbook's rules say what runs instead when it does not."""
        return {
            "alloc.rate": self.call_rate,
            "alloc.tracing_percent": self.estimated_percent,
            "alloc.tracing": self.choice,
        }


class EngineResult(BaseModel):
    """What one diagnosis gathered and concluded: everything the Report is assembled from."""

    model_config = ConfigDict(arbitrary_types_allowed=True, frozen=True)

    observation: Observation
    counters: Counters
    triage: Triage
    facts: dict
    verdict: Verdict
    findings: list[tuple[str, str]]  # the playbook's findings: (rule id, rendered text)
    advice: list[str]  # the playbook's advice, rendered
    results: dict[str, ProbeResult]  # by probe name, the probes that ran
    trail: list[TrailItem]
    budget_decision: BudgetDecision | None = None  # None: memleak was never priced
    one_offs: list[tuple[str, float, float, int]] = []  # (step, seconds, target ns, events) before any probe
    counted: set[str] = set()  # entry points the rate count counted
    interruption: Interrupted | None = None  # a signal ended the diagnosis early
    classes: Classes  # the frame classes the culprit was named with


def _warm_up(target_kind: str) -> None:
    with contextlib.suppress(Exception):  # a probe that cannot load says why when it is run
        prepare.prepare((target_kind,))


def probe_target(target: Target) -> ProbeTarget:
    if target.kind == "pid" and target.pid is not None:
        return ProbeTarget.for_pid(target.pid)
    if target.kind == "cgroup" and target.cgroup is not None:
        return ProbeTarget.for_cgroup(target.cgroup.fs_path, target.cgroup.path)
    return ProbeTarget(kind="system")


class Engine:
    def __init__(
        self,
        rules: list[Rule],
        target: Target,
        duration: float,
        budget_percent: float,
        interval: float | None = None,
        on_sample: Callable[[Snapshot, float], None] | None = None,
        on_step: Callable[[str], None] | None = None,
        max_pause_ms: float | None = None,
        wrappers: list[FrameClass] | None = None,
        clock: Callable[[], float] = time.monotonic,
        runner: Callable[[str, float], ProbeResult] | None = None,
        pricer: Callable[[float], BudgetDecision] | None = None,
        given: dict | None = None,
    ):
        """clock, runner (probe name, seconds -> result) and pricer (seconds memleak would run ->
        decision) are the real ones unless a test gives its own; given: facts known beforehand."""
        self.rules, self.target, self.duration, self.budget = rules, target, duration, budget_percent
        self.interval, self.on_sample, self.on_step = interval, on_sample, on_step or (lambda _s: None)
        self.max_pause_ms = max_pause_ms
        self.classes = Classes(wrappers) if wrappers is not None else default_classes()
        self.runtime = read_runtime(target.pid) if target.kind == "pid" and target.pid is not None else None
        self.trail: list[TrailItem] = []
        self.results: dict[str, ProbeResult] = {}
        self.budget_decision: BudgetDecision | None = None
        self.clock = clock
        self.run_probe = runner or self._run_probe
        self.price_memleak = pricer or self._price_memleak
        self.started = clock()
        self.facts: dict = {}  # what the rules last ran on
        self.outcomes: list[tuple[Rule, Outcome]] = []
        self.allocator: str | None = None  # the allocator memleak would trace (found when it is priced)
        self._first_processes: dict = {}  # the process table at the window's first sample (observe fills it)
        self.decided: set[str] = set()
        self.costs = None  # this host's per-trap costs, once memleak was priced
        self.spent_ns = 0.0  # the target's time spent on one-off steps (the rate count)
        self.one_offs: list[tuple[str, float, float, int]] = []  # (step, seconds, target ns, events)
        self.counted: set[str] = set()  # entry points the rate count counted
        self.site_rates: dict[str, float] | None = None  # their calls per second
        self.cpu_start = cpu_seconds(target.pid) if target.kind == "pid" and target.pid is not None else None
        self.interruption: Interrupted | None = None  # a signal ended the diagnosis early
        self.given = dict(given or {})

    # --- time ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        return self.duration - self.elapsed()

    # --- facts ----------------------------------------------------------------------------
    def facts_of(self, obs: Observation) -> tuple[dict, Counters, Triage]:
        counters = build_counters(obs)
        tri = triage(obs, counters)
        f = counter_facts(obs, counters, self.budget)
        f.update(self.given)
        f["target.name"] = self.target.describe()
        t = self.target
        f.update(target_facts(t.kind, t.pid, t.cmdline, self.runtime))
        f.update(tri.facts)  # the counters in words: summary.*
        f.update(probe_facts(self.results, self.classes))
        # not priced (memleak not asked for, or no time left for it): the fallback rule is false, not missing
        f.update(self.budget_decision.facts() if self.budget_decision is not None else {"alloc.tracing": "none"})
        f["alloc.allocator"] = self.allocator
        return f, counters, tri

    # --- probes ---------------------------------------------------------------------------
    def _price_memleak(self, run_s: float) -> BudgetDecision:
        """Allocation tracing priced site by site (probes/overhead.py): each counted entry point's
        rate x what a call through its probe costs (emulated or single-stepped trap, return probe,
        memleak's program), over the time memleak would run plus its detach, as a share of the
        window, against the budget. The rate count's own cost is spent already and counts too.
        run_s: how long memleak would run (what the rule asked, within what is left)."""
        from memdiag.probes.allocator import ALLOCATING, find_allocator
        from memdiag.probes.calibrate import host_costs
        from memdiag.probes.overhead import price, trap_ns
        from memdiag.probes.ratecount import estimate_call_rates

        if self.target.kind != "pid" or self.target.pid is None:
            return BudgetDecision(
                choice="fallback",
                reason="allocation tracing is priced per process, not for a cgroup or the whole system",
            )
        costs = host_costs()
        alloc = find_allocator(self.target.pid)
        self.allocator = alloc.name if alloc is not None else None
        rates = None
        if costs is not None and alloc is not None:
            traps = {p.function: trap_ns(p, costs) for p in alloc.placements}
            rates = estimate_call_rates(self.target.pid, trap_ns=traps, alloc=alloc, functions=ALLOCATING)
        if costs is None or alloc is None or rates is None:
            return BudgetDecision(
                choice="unknown",
                reason="could not price allocation tracing (no allocator found or the count failed)",
            )
        self.costs = costs
        self._spend("ratecount", rates)
        allocating = sum(r.per_s for r in rates.counts)
        first_step = [p for p in alloc.placements if p.function in ALLOCATING]
        prefix = " and ".join(r.function for r in rates.counts) + " alone: "
        decision = self._decide(price(first_step, rates.per_s(), costs), allocating, rates, prefix, run_s)
        if decision.choice != "full":
            return decision
        return self._price_every(alloc, traps, rates, run_s)

    def _price_every(self, alloc, traps: dict[str, float], rates, run_s: float) -> BudgetDecision:
        """The second step, when the allocating calls alone did not price memleak out: count the
        others (free, calloc, realloc, mmap ...) and price every site."""
        from memdiag.probes.allocator import ALLOCATING
        from memdiag.probes.overhead import price
        from memdiag.probes.ratecount import COUNTED, estimate_call_rates

        assert self.target.pid is not None and self.costs is not None
        allocating = sum(r.per_s for r in rates.counts)
        others = tuple(f for f in COUNTED if f not in ALLOCATING)
        more = estimate_call_rates(self.target.pid, trap_ns=traps, alloc=alloc, functions=others)
        if more is not None:
            self._spend("ratecount", more)
        every = rates.plus(more)
        if sum(r.calls for r in every.counts) == 0:
            names = ", ".join(r.function for r in every.counts)
            first = every.counts[0]
            return BudgetDecision(
                choice="fallback",
                call_rate=0.0,
                reason=f"no call to {names} in {first.seconds:.2f} s: the memory does not come through "
                f"{first.module.rsplit('/', 1)[-1]} (direct brk/mmap, or a runtime with its own allocator)",
            )
        per_s = every.per_s()
        if more is None:  # the second count failed: price each free as an allocation's (they pair up)
            per_s.setdefault("free", allocating)
        self.site_rates = per_s
        return self._decide(price(alloc.placements, per_s, self.costs), allocating, every, "", run_s)

    def _spend(self, step: str, rates) -> None:
        """A one-off step's cost to the target, kept for the probe table (merged by step)."""
        self.spent_ns += rates.cost_ns
        self.counted.update(r.function for r in rates.counts)
        for i, (name, seconds, ns, events) in enumerate(self.one_offs):
            if name == step:
                self.one_offs[i] = (name, seconds + rates.probes_s, ns + rates.cost_ns, events + rates.hits)
                return
        self.one_offs.append((step, rates.probes_s, rates.cost_ns, rates.hits))

    def _decide(self, pr, allocating: float, rates, prefix: str, run_s: float) -> BudgetDecision:
        """Full tracing or not: the price's rate of cost over the time memleak would run and its
        detach, with what was spent already, as a share of the window, against the budget."""
        from memdiag.probes.overhead import detach_seconds

        projected = 100 * (pr.ns_per_s * (run_s + detach_seconds()) + self.spent_ns) / (self.duration * 1e9)
        common = dict(
            estimated_percent=projected,
            attached_percent=pr.percent,
            call_rate=allocating,
            cost_ns=pr.ns_per_s / allocating if allocating else None,
            sites=pr.describe(),
        )
        what = (
            f"{prefix}{pr.describe()} (rates counted over {rates.counts[0].seconds:.2f} s, corrected for the "
            f"count's own traps) = {pr.percent:.2f}% of a CPU while attached; over the {run_s:.0f} s it would "
            f"run and its detach, with the rate count's {self.spent_ns / 1e6:.1f} ms, {projected:.2f}% of the "
            f"{self.duration:.0f} s window"
        )
        rare = ", ".join(f for f in pr.uncounted() if not prefix)
        if rare:
            what += f" ({rare} not counted beforehand: measured once attached)"
        if projected <= self.budget:
            return BudgetDecision(choice="full", reason=f"{what} <= budget {self.budget:g}%", **common)
        return BudgetDecision(
            choice="fallback",
            reason=f"{what} > budget {self.budget:g}%: every uprobe hit is a trap whatever the program does, so "
            "sampling or a size filter would not make it cheaper",
            **common,
        )

    def _allowance_ns(self) -> float:
        """What the budget leaves of the window for memleak: its share, less what was spent."""
        return max(0.0, self.budget / 100 * self.duration * 1e9 - self.spent_ns)

    def _cpu_baseline(self) -> float | None:
        """The target's CPU seconds per second since the engine started, before any probe."""
        if self.cpu_start is None or self.target.pid is None:
            return None
        now = cpu_seconds(self.target.pid)
        seconds = self.elapsed()
        return (now - self.cpu_start) / seconds if now is not None and seconds > 1.0 else None

    def _run_probe(self, name: str, seconds: float) -> ProbeResult:
        t = probe_target(self.target)
        self.on_step(f"probe {name} for {seconds:.0f} s")
        loader = REGISTRY.spec(name).loader()
        if name == "memleak":  # priced: what it may cost and where its calls go, from the rate count
            return loader.run(
                t,
                seconds,
                series_interval=max(1.0, seconds / 10),
                costs=self.costs,
                site_rates=self.site_rates,
                allowance_ns=self._allowance_ns() if self.costs is not None else None,
                cpu_baseline=self._cpu_baseline(),
                scan_reach=True,
                reach_allowed_ms=self.max_pause_ms,
            )
        return loader.run(t, seconds)

    def run_requests(self, requests: list[tuple[str, float | None, str]]) -> None:
        """Run each requested probe once, in order, sharing the time left."""
        queue = self._plan(requests)
        for i, (name, seconds, rule) in enumerate(queue):
            if self._skipped_by_signal(name, rule):
                continue
            left = self.left() - 1.0
            share = left / (len(queue) - i)
            run_for = min(seconds, left) if seconds else share
            if run_for < MIN_PROBE_S:
                self._not_run(name, f"asked by {rule}, but only {max(left, 0):.0f} s of the window were left")
                continue
            with phase(f"probe {name}"):
                result = self.run_probe(name, run_for)
            self._record(name, rule, result)

    def _plan(self, requests: list[tuple[str, float | None, str]]) -> list[tuple[str, float | None, str]]:
        """The queue: each probe once per diagnosis; memleak priced first, and what the playbook
        runs instead queued in its place when it is not attached."""
        queue: list[tuple[str, float | None, str]] = []
        for name, seconds, rule in requests:
            if name in self.results or name in self.decided or any(q[0] == name for q in queue):
                continue
            self.decided.add(name)  # a probe is priced, run or refused once per diagnosis
            planned = min(seconds or float("inf"), self.left() - 1.0)  # as run_requests gives it, at most
            if name == "memleak" and planned >= MIN_PROBE_S:  # too little time left: not run, so not priced
                if self._skipped_by_signal(name, rule):
                    continue
                if not self._priced_in(planned):
                    for alt, alt_s in self._instead_of_memleak():
                        if alt not in self.decided and all(q[0] != alt for q in queue):
                            self.decided.add(alt)
                            queue.append((alt, alt_s, f"budget (instead of memleak, asked by {rule})"))
                    continue
            queue.append((name, seconds, rule))
        return queue

    def _priced_in(self, planned: float) -> bool:
        """Price memleak for the time it would run; the decision goes in the trail. True: attach it."""
        with phase("pricing memleak (counting allocator calls)"):
            self.budget_decision = d = self.price_memleak(planned)
        if d.choice != "full":  # what runs instead is the playbook's (memleak-over-budget), said as it is
            names = list(dict.fromkeys(name for name, _ in self._instead_of_memleak()))
            instead = f"in its place the playbook runs {', '.join(names)}" if names else "nothing runs in its place"
            self.budget_decision = d = d.model_copy(update={"reason": f"{d.reason}; {instead}"})
        self.trail.append(
            TrailItem(kind="budget", name="memleak", state=d.choice, reason=d.reason, at_s=self.elapsed())
        )
        return d.choice == "full"

    def _instead_of_memleak(self) -> list[tuple[str, float | None]]:
        """The probes of the rules that fire once the budget decision is known (the playbook's
        fallback for allocation tracing), in the playbook's order."""
        assert self.budget_decision is not None
        before = {rule.id for rule, o in self.outcomes if o.state == "fired"}
        after = run_rules(self.rules, {**self.facts, **self.budget_decision.facts()})
        return [
            (p.name, p.seconds)
            for rule, o in after
            if o.state == "fired" and rule.id not in before
            for p in rule.then.probes
        ]

    def _record(self, name: str, rule: str, result: ProbeResult) -> None:
        """A probe's result kept, with a line in the trail (and one for memleak's scan)."""
        self.results[name] = result
        why = f"asked by {rule}; {result.status}" + (f": {result.reason}" if result.reason else "")
        if result.backed_off:
            why += "; detached early: its measured cost went over the budget"
        self.trail.append(TrailItem(kind="probe", name=name, state=result.status, reason=why, at_s=self.elapsed()))
        scan = getattr(result, "reach_scan", None)
        if scan is not None:
            self.trail.append(
                TrailItem(kind="scan", name="reach", state=scan.status, reason=scan.describe(), at_s=self.elapsed())
            )

    # --- rules -----------------------------------------------------------------------------
    def evaluate(self, facts: dict) -> list[tuple[str, float | None, str]]:
        """Run the rules on the facts; the probes the fired rules ask for, as (name, seconds, rule)."""
        self.facts = facts
        self.outcomes = run_rules(self.rules, facts)
        requests = []
        for rule, outcome in self.outcomes:
            if outcome.state == "fired":
                requests += [(p.name, p.seconds, rule.id) for p in rule.then.probes]
        return requests

    def run(self) -> EngineResult:
        """Counters for the whole window; rules and probes in rounds after the first look; the
        verdict on everything gathered."""
        sink: list[Snapshot] = []
        stop = threading.Event()
        box: dict = {}
        first = self._first_processes

        def sample() -> None:
            box["obs"] = observe(
                self.target,
                self.duration,
                self.interval,
                on_sample=self.on_sample,
                sink=sink,
                stop=stop,
                first_sink=first,
            )

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        # Programs not compiled for this kernel yet are compiled while the counters are read, in
        # a child process: the probes then load bytecode and keep their whole share of the window.
        threading.Thread(target=_warm_up, args=(probe_target(self.target).kind,), daemon=True).start()
        first_look = min(self.duration, max(FIRST_LOOK_MIN_S, FIRST_LOOK_SHARE * self.duration))
        with phase("counters (first look)"):
            self._wait(sampler, stop, first_look)
        try:
            self._rounds(sampler, sink)
        except KeyboardInterrupt:  # a caller that did not catch signals (memdiag's CLI does)
            stop.set()
        rules_cut = interrupted()  # the signal came before the rules had asked for everything
        with phase("counters (rest of the window)"):
            self._wait(sampler, stop)  # the counters cover the whole window, probes or not
        sampler.join()
        obs: Observation = box["obs"]
        if interrupted():
            obs = obs.model_copy(update={"interrupted": True})
        return self._finish(obs, rules_cut)

    def _rounds(self, sampler: threading.Thread, sink: list[Snapshot]) -> None:
        """Rules on the counters so far, the probes they ask for, again, until nothing new is asked."""
        rounds = 0
        while sampler.is_alive() and self.left() > MIN_PROBE_S and rounds < 4 and not interrupted():
            rounds += 1
            # the process tables too: who pays in major faults is read from them (the playbook's
            # target-pays), and a round without them never asked for the pressure probes
            partial = Observation(
                target=self.target,
                requested_s=self.duration,
                started=time.time() - self.elapsed(),
                ended=time.time(),
                snapshots=list(sink),
                oom_kills=read_oom_kills(),
                processes_first=dict(self._first_processes),
                processes_last=read_all_processes() if self._first_processes else {},
                memdiag_pid=os.getpid(),
            )
            facts, _c, _t = self.facts_of(partial)
            requests = [r for r in self.evaluate(facts) if r[0] not in self.results and r[0] not in self.decided]
            if not requests:
                break
            self.run_requests(requests)

    def _finish(self, obs: Observation, rules_cut: bool) -> EngineResult:
        """The rules on the whole window and every probe's facts, each in the trail; the verdict."""
        facts, counters, tri = self.facts_of(obs)
        self.evaluate(facts)
        best = winner_of(self.outcomes)
        for rule, outcome in self.outcomes:
            reason = outcome.reason
            if best is not None and rule is not best and outcome.state == "fired" and rule.then.verdict is not None:
                # every verdict rule that fired is in the trail; a reader must see which one concluded
                reason = f"{reason}; outranked by {best.id}" if reason else f"outranked by {best.id}"
            self.trail.append(
                TrailItem(
                    kind="rule",
                    name=rule.id,
                    state=outcome.state,
                    reason=reason,
                    source=rule.source,
                    at_s=self.elapsed(),
                )
            )
        verdict, findings, advice = self._conclude(facts, tri)
        if interrupted():
            self.interruption = self._interruption(obs, rules_cut)
            verdict = partial_verdict(verdict, self.interruption)
        return EngineResult(
            observation=obs,
            counters=counters,
            triage=tri,
            facts=facts,
            verdict=verdict,
            findings=findings,
            advice=advice,
            results=self.results,
            trail=self.trail,
            budget_decision=self.budget_decision,
            one_offs=self.one_offs,
            counted=self.counted,
            interruption=self.interruption,
            classes=self.classes,
        )

    # --- signals -------------------------------------------------------------------------------
    @staticmethod
    def _wait(sampler: threading.Thread, stop: threading.Event, seconds: float | None = None) -> None:
        """Wait for the sampler (at most seconds); a signal stops it: the counters end there."""
        end = None if seconds is None else time.monotonic() + seconds  # the sampler's own clock, real
        while sampler.is_alive() and (end is None or time.monotonic() < end):
            if interrupted():
                stop.set()
                return
            sampler.join(0.05 if end is None else max(0.0, min(0.05, end - time.monotonic())))

    def _not_run(self, name: str, reason: str) -> None:
        self.trail.append(TrailItem(kind="probe", name=name, state="not-run", at_s=self.elapsed(), reason=reason))

    def _skipped_by_signal(self, name: str, rule: str) -> bool:
        """After a signal no probe is priced or attached: it goes in the trail as not run."""
        if not interrupted():
            return False
        self._not_run(name, f"asked by {rule}, but {INTERRUPTION.signal_name} interrupted the diagnosis first")
        return True

    def _interruption(self, obs: Observation, rules_cut: bool) -> Interrupted:
        """What the signal cost the diagnosis: where it came and what was not gathered."""
        missing = []
        seen = obs.ended - obs.started
        if seen < self.duration - 0.5:
            missing.append(f"the counters after {fmt_duration(seen)} of the {fmt_duration(self.duration)} window")
        for name, r in self.results.items():
            if r.interrupted:
                missing.append(f"{name}: stopped after {fmt_duration(r.duration_s)} of its time")
            scan = getattr(r, "reach_scan", None)
            if name == "memleak" and r.interrupted and (scan is None or scan.status != "ran"):
                missing.append("the reachability scan (which outstanding blocks are leaked, which still anchored)")
        missing += [f"{t.name}: not run" for t in self.trail if t.kind == "probe" and "interrupted the" in t.reason]
        if rules_cut:
            missing.append("any probe the rules would have asked for later")
        at = (INTERRUPTION.at - self.started) if INTERRUPTION.at is not None else self.elapsed()
        return Interrupted(
            signal=INTERRUPTION.signal_name,
            phase=INTERRUPTION.phase or "unknown",
            at_s=round(at, 2),
            not_gathered=missing,
        )

    def _conclude(self, facts: dict, tri: Triage) -> tuple[Verdict, list[tuple[str, str]], list[str]]:
        """The verdict of the highest-priority fired rule; findings and next steps of all fired rules."""
        c = conclude(self.outcomes, facts)
        action = c.winner.then.verdict if c.winner is not None else None
        if action is None or c.summary is None:  # a playbook without a floor (the shipped one has `no-conclusion`)
            none = Verdict(kind="inconclusive", summary="no playbook rule concluded", confidence=0.0)
            return none.model_copy(update={"culprit": self._culprit("inconclusive", tri)}), c.findings, c.advice
        verdict = Verdict(
            kind=action.kind,
            summary=c.summary,
            confidence=action.confidence,
            culprit=self._culprit(action.kind, tri),
            rule=c.winner.id if c.winner else None,
            because=c.because,
        )
        return verdict, c.findings, c.advice

    def _culprit(self, kind: str, tri: Triage) -> Culprit:
        t = self.target
        base = Culprit(pid=t.pid, comm=t.comm, cgroup=t.cgroup.path if t.cgroup else None)
        if kind == "oom" and "oom" in tri.culprits:
            return tri.culprits["oom"]
        if "growth" in tri.culprits and t.kind != "pid":
            base = tri.culprits["growth"]
        stack = self._stack_for(kind)
        if stack is None:
            return base
        named = self.classes.name(stack.frames, getattr(stack, "forwards", None))
        return base.model_copy(
            update={
                "stack": stack.frames,
                "function": named.function,
                "frame_kinds": named.kinds,
                "guessed": named.guessed,
            }
        )

    def _stack_for(self, kind: str):
        """The stack the verdict rests on (a memleak LeakStack or a fault/brk/mmap stack), if any."""
        ml = self.results.get("memleak")
        leak = ml.leak_stack() if ml is not None and kind == "leak" else None
        if leak is not None:  # the stack whose blocks nothing points at, as the leak rule read it
            return leak
        if kind in ("leak", "cache", "growth") and ml is not None and ml.stacks:
            return ml.stacks[0]
        for spec in REGISTRY.event_stacks():
            r = self.results.get(spec.name)
            if r is not None and getattr(r, "stacks", None):
                return r.stacks[0]
        return None


PARTIAL_CONFIDENCE = 0.5  # at most this sure of a verdict a signal cut short


def partial_verdict(verdict: Verdict, cut: Interrupted) -> Verdict:
    """The verdict a signal cut short: said to be partial, its confidence halved (at most 50%)."""
    return verdict.model_copy(
        update={
            "summary": f"PARTIAL: interrupted by {cut.signal} during {cut.phase}, so not everything was "
            f"gathered; from what was: {verdict.summary}",
            "confidence": round(min(verdict.confidence / 2, PARTIAL_CONFIDENCE), 2),
        }
    )
