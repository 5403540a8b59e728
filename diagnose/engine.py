"""The diagnosis engine schedules: counters -> rules -> probes -> facts -> rules again, within the
window and under the overhead budget, then the verdict the playbook reaches.

The counters are sampled for the whole window in a background thread (observe.Sampler). After a
first stretch (a third of the window, at least 5 s) the rules run on what the counters say; the
probes they ask for run one after another in the time left (never twice); their results become
facts and the rules run again, until nothing new is asked or the window is spent. A probe with a
plan (probes/face.py) is asked to price itself before it runs: a plan that does not go is in the
trail, its facts are shown to the rules, and what they then ask for runs in its place. What plans
spent is kept in the budget's ledger, and what is left of the budget is what a probe may spend.
The engine names no probe: every probe is its face, read from the registry.

Engine.run() returns one EngineResult; diagnose/assemble.py makes the Report of it."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable

from memdiag.probes import prepare
from memdiag.probes.face import Budget, Context, Plan, ProbeResult, TrailItem
from memdiag.probes.registry import REGISTRY
from memdiag.rules.engine import Outcome, run_rules
from memdiag.rules.model import FrameClass, Rule
from memdiag.system import clock, identity
from memdiag.system.process import cpu_seconds
from memdiag.system.signals import INTERRUPTION, interrupted, phase, target_released
from memdiag.system.target import Target

from . import cycles
from .culprit import Classes, default_classes
from .errors import UsageError
from .factset import window_facts
from .observe import Observation, Sampler
from .report import Counters, CycleRecord
from .snapshot import Snapshot
from .target import pid_target
from .triage import Triage
from .verdict import EngineResult, interruption, partial_verdict, rule_steps, verdict_of

FIRST_LOOK_SHARE = 0.3
FIRST_LOOK_MIN_S = 5.0
# Where the rules asked for nothing, they look again this often (a share of the window or cycle, at
# least FIRST_LOOK_MIN_S) while a probe could still run: with one look at 30% a growth that began
# later was never traced (memdiag on a memdiag whose RSS began stepping up 1 MiB a minute after the
# first look of a 180 s window: "growth", no probe run, "no rule asked for it")
LOOK_AGAIN_SHARE = 0.1
MIN_PROBE_S = 3.0
MAX_ROUNDS = 4  # rounds that ran probes

Request = tuple[str, float | None, str]  # (probe, seconds or None: a share of what is left, the rule asking)


def _warm_up(target_kind: str) -> None:
    with contextlib.suppress(Exception):  # a probe that cannot load says why when it is run
        prepare.prepare((target_kind,))


def _symbol_notes() -> list[str]:
    """The modules a probe's symbolization found no symbols in (a corrupt or hostile file), one line
    each (probes/elf.py). Not imported here: where no ELF file was read there is nothing to say."""
    elf = sys.modules.get("memdiag.probes.elf")
    return elf.take_notes() if elf is not None else []


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
        runner: Callable[[str, Context], ProbeResult] | None = None,
        planner: Callable[[str, Context], Plan | None] | None = None,
        given: dict | None = None,
        cycle_s: float | None = None,
        on_cycle: Callable[[EngineResult], None] | None = None,
    ):
        """clock, runner (probe name, context -> result) and planner (probe name, context -> its
        plan) are the probes' own unless a test gives its own; given: facts known beforehand;
        cycle_s: watch the window in cycles of that length (diagnose/cycles.py), on_cycle told
        what the window says so far after each."""
        self.rules, self.target, self.duration, self.budget = rules, target, duration, budget_percent
        self.interval, self.on_sample, self.on_step = interval, on_sample, on_step or (lambda _s: None)
        self.max_pause_ms = max_pause_ms
        self.classes = Classes(wrappers) if wrappers is not None else default_classes()
        # the target's runtime, recognised once: its face's counters are sampled with the rest
        self.runtime = REGISTRY.recognise(target.pid) if target.kind == "pid" and target.pid is not None else None
        self.runtime_mark = self._runtime_mark()
        self.trail: list[TrailItem] = []
        self.results: dict[str, ProbeResult] = {}
        self.plans: dict[str, Plan] = {}
        self.clock, self.started = clock, clock()
        self.run_probe = runner or self._run_probe
        self.plan_probe = planner or (lambda name, ctx: REGISTRY.face(name).plan(self.aim(name), ctx))  # type: ignore[misc]
        self.facts: dict = {}  # what the rules last ran on
        self.outcomes: list[tuple[Rule, Outcome]] = []
        self.decided: set[str] = set()  # probes planned, run or refused: once per diagnosis
        self.spent_ns = 0.0  # the budget's ledger: the target's time plans spent (a rate count)
        self.cpu_start = cpu_seconds(target.pid) if target.kind == "pid" and target.pid is not None else None
        self.given = dict(given or {})
        self.cycle_s, self.on_cycle = cycle_s, on_cycle  # a long window's cycles (diagnose/cycles.py)
        self.cycle_end: float | None = None  # the current cycle's end, seconds into the window
        self.records: list = []  # diagnose.cycles.CycleRecord, one per cycle watched
        self.kept: dict[str, ProbeResult] = {}  # per probe, the run that speaks for the window so far
        self.options: dict[str, dict] = {}  # per probe, its options as its rule gave them from facts
        # per probe, the process of a cgroup target it runs on where its rule named one (`process:`)
        self.aimed: dict[str, Target] = {}
        self.aimed_by: dict[str, str] = {}  # the fact that named it
        self.unaimed: set[str] = set()  # probes whose named process could not be aimed at (said once)
        self.aimed_cpu: dict[int, tuple[float, float]] = {}  # (CPU seconds, clock) of each when aimed at

    def _runtime_mark(self) -> object:
        """The runtime's counters at the window's start, for its probes' rates before (its face's mark)."""
        face = REGISTRY.runtime(self.runtime.name) if self.runtime is not None else None
        if face is None or face.mark is None or self.target.pid is None:
            return None
        return face.mark(self.target.pid)

    # --- time and the budget ---------------------------------------------------------------
    def elapsed(self) -> float:
        return self.clock() - self.started

    def left(self) -> float:
        """Time left in the window, or in the current cycle of a long one."""
        return (self.cycle_end if self.cycle_end is not None else self.duration) - self.elapsed()

    def _budget_window(self) -> float:
        """What the budget is a share of: the window, or a cycle of a long one (each gets its share)."""
        return self.cycle_s if self.cycle_s is not None else self.duration

    def _context(self, seconds: float, name: str | None = None) -> Context:
        """What a probe is told: its time, what the budget leaves, its plan, the pause allowed and
        the target's CPU rate before any probe (a pid's: its traps are charged to it)."""
        rate = None
        if self.cpu_start is not None and self.target.pid is not None and self.elapsed() > 1.0:
            now = cpu_seconds(self.target.pid)
            rate = (now - self.cpu_start) / self.elapsed() if now is not None else None
        aimed = self.aimed.get(name) if name else None
        if aimed is not None and aimed.pid in self.aimed_cpu:  # a cgroup's process: its rate since it was aimed at
            cpu0, at = self.aimed_cpu[aimed.pid]
            now = cpu_seconds(aimed.pid)
            rate = (now - cpu0) / (self.clock() - at) if now is not None and self.clock() - at > 1.0 else None
        return Context(
            seconds=seconds,
            budget=Budget(self.budget, self._budget_window(), self.spent_ns),
            plan=self.plans.get(name) if name else None,
            max_pause_ms=self.max_pause_ms,
            cpu_rate=rate,
            runtime_mark=self.runtime_mark,
            options=self.options.get(name, {}) if name else {},
        )

    # --- facts and rules ---------------------------------------------------------------------
    def facts_of(self, obs: Observation) -> tuple[dict, Counters, Triage]:
        t, given = self.target, {**self.given, **cycles.cycle_facts(self.records)}
        return window_facts(obs, t, self.budget, self.runtime, given, self.results, self.plans, self.classes)

    def evaluate(self, facts: dict) -> list[Request]:
        """Run the rules on the facts; the probes the fired rules ask for, as (name, seconds, rule),
        with the options their rules give from facts kept for their runs (the first asker's)."""
        self.facts = facts
        self.outcomes = run_rules(self.rules, facts)
        requests = []
        for r, o in self.outcomes:
            for p in r.then.probes if o.state == "fired" else []:
                given = [*p.given.values(), *([p.process] if p.process else [])]
                missing = [fact for fact in given if facts.get(fact) is None]
                fresh = p.name not in self.decided and p.name not in self.results
                if missing:
                    if fresh:
                        self.decided.add(p.name)
                        self._not_run(p.name, f"asked by {r.id}, but {', '.join(missing)} is unknown")
                    continue
                if p.process and fresh and p.name not in self.aimed:
                    why = self._aim(p.name, str(facts[p.process]), p.process)
                    if why is not None:  # not decided: another rule may still ask for it on the target
                        if p.name not in self.unaimed:
                            self.unaimed.add(p.name)
                            self._not_run(p.name, f"asked by {r.id} for {p.process} = {facts[p.process]}, but {why}")
                        continue
                self.options.setdefault(p.name, {k: facts[fact] for k, fact in p.given.items()})
                requests.append((p.name, p.seconds, r.id))
        return requests

    def aim(self, name: str) -> Target:
        """What probe `name` runs on: the target, or the process of its cgroup its rule named."""
        return self.aimed.get(name, self.target)

    def _aim(self, name: str, pid_text: str, fact: str) -> str | None:
        """Aim probe `name` at one process of a cgroup target, resolved and held as a pid target is
        (system/identity.py): its allocations are priced and traced, its memory scanned, as
        `--pid` would. None when aimed; else why not (not a process of the cgroup, gone)."""
        if self.target.kind != "cgroup":
            return "the target is no cgroup"
        try:
            pid = int(pid_text)
        except ValueError:
            return "that is no process id"
        if pid not in self.target.pids():
            return f"PID {pid} is not in {self.target.describe()} (now)"
        try:
            aimed = pid_target(pid)
        except UsageError as e:
            return str(e)
        self.aimed[name], self.aimed_by[name] = aimed, fact
        cpu = cpu_seconds(pid)
        if cpu is not None:
            self.aimed_cpu[pid] = (cpu, self.clock())
        return None

    # --- probes ------------------------------------------------------------------------------
    def _run_probe(self, name: str, ctx: Context) -> ProbeResult:
        self.on_step(f"probe {name} for {ctx.seconds:.0f} s")
        return REGISTRY.face(name).run(self.aim(name), ctx)

    def run_requests(self, requests: list[Request]) -> None:
        """Run each requested probe once, in order, sharing the time left."""
        queue = self._queue(requests)
        for i, (name, seconds, rule) in enumerate(queue):
            if self._skipped_by_signal(name, rule) or self._skipped_as_gone(name, rule):
                continue
            left = self.left() - 1.0
            # An even share, but never under the shortest run while the time allows one: the queue is
            # in the playbook's order, so where the time does not divide the first probes run and the
            # last are not run (a 14 s alert window left 5 s after a refused memleak: split three ways
            # nothing ran but mmapsnoop, the last, given all of it).
            share = max(left / (len(queue) - i), min(MIN_PROBE_S, left))
            run_for = min(seconds, left) if seconds else share
            if run_for < MIN_PROBE_S:
                self._not_run(name, f"asked by {rule}, but only {max(left, 0):.0f} s of the window were left")
                continue
            with phase(f"probe {name}"):
                result = self.run_probe(name, self._context(run_for, name))
            self._record(name, rule, result)

    def _queue(self, requests: list[Request]) -> list[Request]:
        """Each probe once per diagnosis; a probe with a plan priced first, and what the playbook
        runs instead queued in its place when its plan does not go."""
        queue: list[Request] = []
        for request in requests:
            self._admit(request, queue)
        return queue

    def _admit(self, request: Request, queue: list[Request]) -> None:
        """Queue one request, priced first when it has a plan; what runs instead is priced the same way."""
        name, seconds, rule = request
        if name in self.results or name in self.decided or any(q[0] == name for q in queue):
            return
        self.decided.add(name)
        planned = min(seconds or float("inf"), self.left() - 1.0)  # as run_requests gives it, at most
        if REGISTRY.face(name).plan is not None and planned >= MIN_PROBE_S:  # else not run: not priced
            if self._skipped_by_signal(name, rule) or self._skipped_as_gone(name, rule):
                return
            if not self._planned_in(name, planned):
                for alt, alt_s in self._instead(self.plans[name]):
                    self._admit((alt, alt_s, f"budget (instead of {name}, asked by {rule})"), queue)
                return
        queue.append(request)

    def _planned_in(self, name: str, planned: float) -> bool:
        """Ask the probe to price itself for the time it would run; the plan goes in the ledger and
        the trail. True: run it."""
        how = REGISTRY.face(name).planning
        with phase(f"pricing {name} ({how})" if how else f"pricing {name}"):
            plan = self.plan_probe(name, self._context(planned))
        if plan is None:
            return True
        self.spent_ns += plan.spent_ns
        if not plan.go:  # what runs instead is the playbook's, said as it is
            names = list(dict.fromkeys(alt for alt, _ in self._instead(plan)))
            instead = f"in its place the playbook runs {', '.join(names)}" if names else "nothing runs in its place"
            plan = plan.model_copy(update={"reason": f"{plan.reason}; {instead}"})
        self.plans[name] = plan
        reason = f"{self._on(name).removeprefix(' ')}: {plan.reason}" if name in self.aimed else plan.reason
        self.trail.append(TrailItem(kind="budget", name=name, state=plan.state, reason=reason, at_s=self.elapsed()))
        return plan.go

    def _instead(self, plan: Plan) -> list[tuple[str, float | None]]:
        """The probes of the rules that fire once the plan's facts are known (the playbook's
        fallback), in the playbook's order."""
        before = {rule.id for rule, o in self.outcomes if o.state == "fired"}
        after = run_rules(self.rules, {**self.facts, **plan.facts})
        return [
            (p.name, p.seconds) for r, o in after if o.state == "fired" and r.id not in before for p in r.then.probes
        ]

    def _record(self, name: str, rule: str, result: ProbeResult) -> None:
        """A probe's result kept, with a line in the trail, and the steps of its own after it."""
        self.results[name] = result
        why = f"asked by {rule}{self._on(name)}; {result.status}" + (f": {result.reason}" if result.reason else "")
        if result.backed_off:
            why += "; detached early: its measured cost went over the budget"
        at = self.elapsed()
        self.trail.append(TrailItem(kind="probe", name=name, state=result.status, reason=why, at_s=at))
        self.trail += [t.model_copy(update={"at_s": at}) for t in REGISTRY.face(name).trail(result)]
        self.trail += [
            TrailItem(kind="probe", name=name, state="no-symbols", reason=line, at_s=at) for line in _symbol_notes()
        ]

    def _on(self, name: str) -> str:
        """Where a probe aimed at one process of the cgroup ran, as its trail line says it."""
        aimed = self.aimed.get(name)
        return f" on {aimed.describe()} of {self.target.describe()}, named by {self.aimed_by[name]}" if aimed else ""

    def _not_run(self, name: str, reason: str) -> None:
        self.trail.append(TrailItem(kind="probe", name=name, state="not-run", at_s=self.elapsed(), reason=reason))

    def _skipped_by_signal(self, name: str, rule: str) -> bool:
        """After a signal no probe is priced or attached: it goes in the trail as not run."""
        if not interrupted():
            return False
        self._not_run(name, f"asked by {rule}, but {INTERRUPTION.signal_name} interrupted the diagnosis first")
        return True

    def _skipped_as_gone(self, name: str, rule: str) -> bool:
        """A process target that exited or exec'd is neither priced nor probed: whatever holds its
        pid now is not it (system/identity.py). In the trail as not run, with what happened. The
        target as resolved (diagnose/target.py holds it): one made up (a test's) is not asked."""
        change = identity.changed(self.aim(name), hold_now=False)
        if change is None:
            return False
        self._not_run(name, f"asked by {rule}, but {change.describe()}")
        return True

    # --- the window -----------------------------------------------------------------------------
    def run(self) -> EngineResult:
        """Counters for the whole window; rules and probes in rounds after the first look; the
        verdict on everything gathered."""
        clock.anchor()  # the host's clock read once for the window: its stamps then follow the monotonic clock
        face = REGISTRY.runtime(self.runtime.name) if self.runtime is not None else None
        sampler = Sampler(self.target, self.duration, self.interval, on_sample=self.on_sample, runtime=face).start()
        # Programs not compiled for this kernel yet are compiled while the counters are read, in
        # a child process: the probes then load bytecode and keep their whole share of the window.
        threading.Thread(target=_warm_up, args=(self.target.kind,), daemon=True).start()
        span = self.cycle_s or self.duration
        first_look = min(span, max(FIRST_LOOK_MIN_S, FIRST_LOOK_SHARE * span))
        with phase("counters (first look)", holds=False):
            sampler.wait(first_look, interrupted)
        try:
            if self.cycle_s is None:
                self.rounds(sampler)
            else:
                cycles.watch(self, sampler)
        except KeyboardInterrupt:  # a caller that did not catch signals (memdiag's CLI does)
            sampler.stop()
        rules_cut = interrupted()  # the signal came before the rules had asked for everything
        if rules_cut:
            # every probe asked has returned (detached, the scan's stop released): what is left is
            # reading counters and writing the report, which the stop's short grace does not cover on a
            # loaded host (CI: a SIGTERM during a reach scan ended memdiag before its partial report)
            target_released()
        with phase("counters (rest of the window)", holds=False):
            sampler.wait(None, interrupted)  # the counters cover the whole window, probes or not
        sampler.join()
        obs = sampler.so_far(closing=True)
        if interrupted():
            obs = obs.model_copy(update={"interrupted": True})
        return self.finish(obs, rules_cut)

    def rounds(self, sampler: Sampler) -> None:
        """Rules on the counters so far and the probes they ask for, again; where they ask for
        nothing new, they look again every look_every() while a probe could still run (in a long
        window's cycle, at the next cycle)."""
        rounds = 0
        while rounds < MAX_ROUNDS:
            if not sampler.alive() or self.left() <= MIN_PROBE_S or interrupted():
                return
            facts, _c, _t = self.facts_of(sampler.so_far())
            requests = [r for r in self.evaluate(facts) if r[0] not in self.results and r[0] not in self.decided]
            if requests:
                self.run_requests(requests)
                rounds += 1
                continue
            if self.cycle_s is not None:  # a long window's rules look again at the next cycle's start
                return
            wait = min(self.look_every(), self.left() - MIN_PROBE_S - 1.0)
            if wait <= 0:
                return
            with phase("counters (looking again)", holds=False):
                sampler.wait(wait, interrupted)

    # --- a long window's cycles (diagnose/cycles.py watches them; the state is the engine's) ------
    def begin_cycle(self, end_s: float) -> int:
        """A cycle begins, ending end_s into the window: the rules may ask for each probe again once
        in it, the budget's ledger starts afresh. Returns where its steps begin in the trail."""
        self.cycle_end = end_s
        self.decided, self.results, self.spent_ns, self.options = set(), {}, 0.0, {}
        self.aimed, self.aimed_by, self.aimed_cpu, self.unaimed = {}, {}, {}, set()
        return len(self.trail)

    def end_cycle(self, record: CycleRecord, trail: list[TrailItem]) -> None:
        """A cycle ended: what it saw kept, the trail as folded so far, and for each probe that ran
        in it, the result that now speaks for the window (its face's keep)."""
        self.records.append(record)
        self.trail = trail
        for name, r in self.results.items():
            self.kept[name] = cycles.kept(self.kept.get(name), r)

    def interim(self, obs: Observation, done: str) -> EngineResult:
        """The window so far, as each probe's kept result says it, while it still runs."""
        self.results = dict(self.kept)
        return self.finish(obs, False, interim=done)

    def end_cycles(self) -> None:
        """The last cycle ended: the window speaks through what each probe kept."""
        self.cycle_end = None
        self.results = dict(self.kept)

    def look_every(self) -> float:
        return max(FIRST_LOOK_MIN_S, LOOK_AGAIN_SHARE * self.duration)

    def finish(self, obs: Observation, rules_cut: bool, interim: str | None = None) -> EngineResult:
        """The rules on the whole window and every probe's facts, each in the trail; the verdict.
        interim: the window still runs (a long one, after a cycle): said, and the trail kept as it was."""
        facts, counters, tri = self.facts_of(obs)
        self.evaluate(facts)
        trail = self.trail + rule_steps(self.outcomes, self.elapsed())
        if interim is None:
            self.trail = trail
        c, verdict = verdict_of(self.outcomes, facts, self.target, tri, self.results, self.classes)
        cut = None
        if interrupted():
            at = (INTERRUPTION.at - self.started) if INTERRUPTION.at is not None else self.elapsed()
            cut = interruption(obs, self.duration, self.results, self.trail, rules_cut, at)
            verdict = partial_verdict(verdict, cut)
        return EngineResult(
            observation=obs,
            counters=counters,
            triage=tri,
            facts=facts,
            verdict=verdict,
            findings=c.findings,
            finding_keys=c.finding_keys,
            advice=c.advice,
            results=self.results,
            plans=self.plans,
            trail=trail,
            interruption=cut,
            classes=self.classes,
            cycles=list(self.records),
            interim=interim,
        )
