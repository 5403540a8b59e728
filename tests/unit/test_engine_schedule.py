"""The engine's scheduling and budget decisions without root or BPF: fake probes (a runner that
returns a result and moves a fake clock on by the seconds it was given) and a fake planner. The
rules are the shipped playbook's, so what runs in memleak's place is what the playbook says."""

from types import SimpleNamespace

import pytest
from memdiag.diagnose.engine import FIRST_LOOK_MIN_S, MIN_PROBE_S, Engine
from memdiag.diagnose.workflow import load_rules
from memdiag.probes.face import Budget, Context, ProbeResult
from memdiag.probes.memleak.plan import MIN_BURST_S, MIN_TRACE_S, MemleakPlan, Schedule, _Pricing, decision
from memdiag.probes.registry import REGISTRY
from memdiag.system.target import Target


class FakeProbes:
    """The clock and the probes: each run takes exactly the seconds it was given."""

    def __init__(self):
        self.now = 1000.0
        self.runs: list[tuple[str, float]] = []
        self.options: dict[str, dict] = {}  # what each probe was given (ctx.options)

    def clock(self) -> float:
        return self.now

    def run(self, name: str, ctx: Context) -> ProbeResult:
        """The probe's own (empty) result, as its face says it returns."""
        self.runs.append((name, round(ctx.seconds, 3)))
        self.options[name] = dict(ctx.options)
        self.now += ctx.seconds
        return REGISTRY.face(name).result(name=name, status="ok", duration_s=ctx.seconds)


def engine(fake: FakeProbes, decided: MemleakPlan | None = None, duration: float = 30.0) -> Engine:
    priced: list[float] = []

    def planner(name: str, ctx: Context) -> MemleakPlan:
        assert name == "memleak", "only memleak has a plan"
        priced.append(ctx.seconds)
        assert decided is not None, "memleak priced when it should not have been"
        return decided

    e = Engine(
        load_rules(),
        Target(kind="system"),
        duration,
        2.0,
        clock=fake.clock,
        runner=fake.run,
        planner=planner,
    )
    e.priced = priced  # type: ignore[attr-defined]
    return e


def trail(e: Engine, kind: str) -> list[tuple[str, str, str]]:
    return [(t.name, t.state, t.reason) for t in e.trail if t.kind == kind]


def test_memleak_over_budget_runs_what_the_playbook_asks_in_its_place():
    fake = FakeProbes()
    over = decision("fallback", "priced at 7% > budget 2%")
    e = engine(fake, over)
    fake.now += 10  # the first look: 20 s of the 30 s window left
    e.run_requests([("memleak", 12.0, "rss-climbing")])
    assert e.priced == [12.0]  # priced for what it would have run
    said = "priced at 7% > budget 2%; in its place the playbook runs faults, brkstack, mmapsnoop"
    assert trail(e, "budget") == [("memleak", "fallback", said)]  # read from the playbook, not written in Python
    assert e.plans["memleak"].reason == said
    # the playbook's memleak-over-budget rule: faults, brkstack, mmapsnoop, sharing the 19 s left
    assert [n for n, _ in fake.runs] == ["faults", "brkstack", "mmapsnoop"]
    assert [s for _, s in fake.runs] == pytest.approx([19 / 3] * 3, abs=0.01)
    reasons = [r for _, _, r in trail(e, "probe")]
    assert reasons == ["asked by budget (instead of memleak, asked by rss-climbing); ok"] * 3
    assert "memleak" not in e.results and e.plans["memleak"].state == over.state


NATIVE = {"target.kind": "pid", "target.runtime": "none"}


def hot_native(allocator: str) -> tuple[FakeProbes, Engine]:
    """A native program under allocator whose memleak is priced far over the budget, 10 s in."""
    fake = FakeProbes()
    e = engine(fake, decision("fallback", "priced at 490% > budget 2%", allocator=allocator))
    e.facts = dict(NATIVE)
    fake.now += 10
    e.run_requests([("memleak", 12.0, "rss-climbing")])
    return fake, e


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_a_hot_allocator_gets_page_faults_first_then_its_function_traced_with_the_rest(allocator):
    """memleak over the budget on a native glibc or jemalloc program: faults for 6 s (not all the
    time left, as elsewhere), then, once they name a function, sites on that function for what is
    left."""
    fake, e = hot_native(allocator)
    assert fake.runs == [("faults", 6.0)]
    assert trail(e, "budget")[0][2].endswith("in its place the playbook runs faults")
    facts = {**NATIVE, **e.plans["memleak"].facts, "faults.top_function": "grow_orders"}
    asked = [r for r in e.evaluate(facts) if r[0] not in e.results and r[0] not in e.decided]
    assert asked == [("sites", None, "trace-the-faulting-function")]
    e.run_requests(asked)
    assert fake.runs[-1] == ("sites", 13.0) and fake.options["sites"] == {"function": "grow_orders"}


def test_where_page_faults_name_no_function_brk_and_mmap_get_the_rest():
    fake, e = hot_native("jemalloc")
    facts = {**NATIVE, **e.plans["memleak"].facts}
    pending = [r for r in e.evaluate(facts) if r[0] not in e.results and r[0] not in e.decided]
    assert pending == []  # before faults has said anything, nothing else is asked
    asked = [r for r in e.evaluate({**facts, "faults.counted": 40}) if r[0] not in e.results]
    assert asked == [("brkstack", None, "faults-name-no-function"), ("mmapsnoop", None, "faults-name-no-function")]
    e.run_requests(asked)
    assert fake.runs[1:] == [("brkstack", 6.5), ("mmapsnoop", 6.5)]


def test_an_allocator_memdiag_cannot_narrow_shares_the_time_among_faults_brk_and_mmap():
    fake, e = hot_native("tcmalloc")
    assert [n for n, _ in fake.runs] == ["faults", "brkstack", "mmapsnoop"]


def test_a_probe_whose_given_fact_is_unknown_is_not_run_and_the_trail_says_which(tmp_path):
    from memdiag.rules.loader import load_file

    path = tmp_path / "given.yaml"
    path.write_text(
        "rules:\n  - id: trace-it\n    when: {present: process.rss}\n    then:\n"
        "      probes: [{name: sites, given: {function: faults.top_function}}]\n"
    )
    fake = FakeProbes()
    e = Engine(load_file(path), Target(kind="system"), 30.0, 2.0, clock=fake.clock, runner=fake.run)
    assert e.evaluate({"process.rss": 1 << 30}) == []
    assert trail(e, "probe") == [("sites", "not-run", "asked by trace-it, but faults.top_function is unknown")]
    e.evaluate({"process.rss": 1 << 30})  # said once
    assert len(trail(e, "probe")) == 1 and fake.runs == []


def test_memleak_within_budget_runs_for_what_the_rule_asked():
    fake = FakeProbes()
    e = engine(fake, decision("full", "0.5% <= budget 2%"))
    fake.now += 10
    e.run_requests([("memleak", 12.0, "rss-climbing"), ("memleak", 5.0, "another-rule")])
    assert fake.runs == [("memleak", 12.0)]  # once per diagnosis, as the first asker asked
    assert trail(e, "probe") == [("memleak", "ok", "asked by rss-climbing; ok")]


def test_probes_share_the_time_left_and_a_duration_is_a_ceiling():
    fake = FakeProbes()
    e = engine(fake)
    fake.now += 10  # 20 s left, 1 s kept for the end: 19
    e.run_requests([("swapin", 4.0, "pressure"), ("vmscan", None, "pressure"), ("drsnoop", None, "pressure")])
    assert fake.runs == [("swapin", 4.0), ("vmscan", 7.5), ("drsnoop", 7.5)]


def test_where_the_time_left_does_not_divide_the_first_probes_run_and_the_last_not():
    fake = FakeProbes()
    e = engine(fake)
    fake.now += 30 - 6  # 6 s left, 5 after the margin: a third each would be under MIN_PROBE_S
    e.run_requests([("faults", None, "growth"), ("brkstack", None, "growth"), ("mmapsnoop", None, "growth")])
    assert fake.runs == [("faults", MIN_PROBE_S)]  # the playbook's first, for the shortest run
    assert trail(e, "probe")[1:] == [
        ("brkstack", "not-run", "asked by growth, but only 2 s of the window were left"),
        ("mmapsnoop", "not-run", "asked by growth, but only 2 s of the window were left"),
    ]


def test_too_little_time_left_is_not_run_and_memleak_not_priced():
    fake = FakeProbes()
    e = engine(fake)  # no decision: pricing would fail the test
    fake.now += 30 - MIN_PROBE_S  # 3 s left, 2 after the margin
    e.run_requests([("memleak", 12.0, "rss-climbing"), ("faults", 5.0, "growth")])
    assert fake.runs == [] and e.priced == []
    assert trail(e, "probe") == [
        ("memleak", "not-run", "asked by rss-climbing, but only 2 s of the window were left"),
        ("faults", "not-run", "asked by growth, but only 2 s of the window were left"),
    ]


class FakeSampler:
    """The counters' thread as the rounds see it: waiting moves the fake clock on."""

    def __init__(self, fake: FakeProbes):
        self.fake, self.waits = fake, []

    def alive(self) -> bool:
        return True

    def so_far(self):
        return None

    def wait(self, seconds, _interrupted) -> None:
        self.waits.append(round(seconds, 3))
        self.fake.now += seconds


def rules_asking_from(e: Engine, at_s: float | None) -> list[float]:
    """The rules replaced by ones that ask for faults once at_s seconds of the window have passed
    (None: never); the times they looked, returned as they are filled."""
    looked: list[float] = []

    def evaluate(_facts):
        looked.append(round(e.elapsed(), 3))
        return [("faults", None, "growth")] if at_s is not None and e.elapsed() >= at_s else []

    e.facts_of = lambda _obs: ({}, None, None)  # type: ignore[method-assign]
    e.evaluate = evaluate  # type: ignore[method-assign]
    return looked


def test_rules_that_asked_nothing_at_the_first_look_look_again_and_a_later_growth_is_traced():
    fake = FakeProbes()
    e = engine(fake, duration=30.0)
    looked = rules_asking_from(e, at_s=15.0)  # the growth shows from 15 s on
    fake.now += 9  # the first look, at 30% of the window
    e.rounds(FakeSampler(fake))
    assert looked[:3] == [9.0, 9 + FIRST_LOOK_MIN_S, 9 + 2 * FIRST_LOOK_MIN_S]
    # faults asked at the look after 15 s, for what is left of the window but the margin
    assert fake.runs == [("faults", round(30 - 19 - 1.0, 3))]
    assert trail(e, "probe") == [("faults", "ok", "asked by growth; ok")]


def test_rules_that_never_ask_stop_looking_when_no_probe_could_run_anymore():
    fake = FakeProbes()
    e = engine(fake, duration=30.0)
    looked = rules_asking_from(e, at_s=None)
    fake.now += 9
    sampler = FakeSampler(fake)
    e.rounds(sampler)
    assert fake.runs == []
    # the last look leaves the shortest probe run and the margin: never later
    assert looked[-1] == 30 - MIN_PROBE_S - 1.0 and sampler.waits[-1] > 0
    assert len(looked) == 1 + len(sampler.waits)


def test_a_probe_without_time_to_run_is_said_once_however_often_the_rules_look():
    fake = FakeProbes()
    e = engine(fake, duration=30.0)
    rules_asking_from(e, at_s=0.0)
    fake.now += 30 - 3.5  # a probe needs MIN_PROBE_S after the 1 s margin: not there
    e.rounds(FakeSampler(fake))
    assert fake.runs == []
    assert trail(e, "probe") == [("faults", "not-run", "asked by growth, but only 2 s of the window were left")]


def _price(ns_per_s: float) -> SimpleNamespace:
    return SimpleNamespace(
        ns_per_s=ns_per_s,
        percent=ns_per_s / 1e7,
        describe=lambda: "malloc+0 (emulated) 1,000/s x 1.0 µs",
        uncounted=lambda: [],
    )


def test_the_budget_decision_is_the_projected_share_of_the_window():
    from memdiag.probes.memleak.meter import detach_seconds

    rates = SimpleNamespace(counts=[SimpleNamespace(seconds=0.25)])
    # the rate count's 1 ms spent already; 12 s attached + the detach at 40 ms of the target's time
    # a second, over a 30 s window
    pricing = _Pricing(
        Budget(2.0, 30.0, spent_ns=1e6), Schedule(12.0), costs=None, allocator="glibc", allocating=1000.0
    )
    cheap = pricing.decide(_price(4e7), rates, "")
    expected = 100 * (4e7 * (12 + detach_seconds()) + 1e6) / 30e9
    assert cheap.choice == "full" and cheap.go and cheap.estimated_percent == pytest.approx(expected)
    assert cheap.reason.endswith("<= budget 2%") and cheap.cost_ns == pytest.approx(4e4)
    # 100 ms a second: 12 s is over the budget, the 5.x s it pays for are traced (within it)
    shorter = pricing.decide(_price(1e8), rates, "")
    fits = (0.02 * 30e9 - 1e6) / 1e8 - detach_seconds()
    assert shorter.choice == "full" and shorter.schedule.seconds == pytest.approx(fits, abs=0.1)
    assert shorter.schedule.seconds <= fits and shorter.estimated_percent <= 2.0
    assert f"the budget pays for {shorter.schedule.seconds:g} s of it: traced for those" in shorter.reason
    # 200 ms a second: what it pays for (under 3 s) is too short for a stack's trend: refused
    dear = pricing.decide(_price(2e8), rates, "malloc alone: ")
    assert dear.choice == "fallback" and not dear.go and "> budget 2%: every uprobe hit is a trap" in dear.reason
    assert f"under the {MIN_TRACE_S:g} s a stack's trend needs" in dear.reason
    assert dear.reason.startswith("malloc alone: malloc+0") and dear.facts["alloc.tracing"] == "fallback"
    assert dear.facts["alloc.allocator"] == "glibc"
    # with a scan to end it (its pause kept out of what the budget pays for), a trace shorter than a
    # trend's 5 s goes: 200 ms a second pays for about 2.x s, the scan alone telling leak from held
    scanned = _Pricing(Budget(2.0, 30.0, spent_ns=1e6), Schedule(12.0), None, "glibc", allocating=1000.0, scan_ms=50.0)
    burst = scanned.decide(_price(2e8), rates, "")
    fits = (0.02 * 30e9 - 1e6 - 50e6) / 2e8 - detach_seconds()
    assert burst.choice == "full" and burst.schedule.seconds == pytest.approx(fits, abs=0.1)
    assert burst.schedule.seconds < MIN_TRACE_S
    assert burst.schedule.seconds <= fits and burst.estimated_percent <= 2.0 * (600 - 50) / 600
    assert "with ~50 ms kept for the reachability scan at its end (an estimate)" in burst.reason
    assert "the scan alone tells leak from held" in burst.reason
    # the scan kept out of the 5.x s too; and what pays for under MIN_BURST_S is refused, saying so
    assert scanned.decide(_price(1e8), rates, "").schedule.seconds < shorter.schedule.seconds
    refused = scanned.decide(_price(2e9), rates, "")
    assert refused.choice == "fallback" and f"under the {MIN_BURST_S:g} s a trace ended by" in refused.reason
    # N bursts of L seconds are priced as what they keep attached: each burst and its detach
    bursts = _Pricing(Budget(2.0, 30.0), Schedule(2.0, bursts=3), costs=None, allocator="glibc", allocating=1000.0)
    three = bursts.decide(_price(4e7), rates, "")
    assert three.estimated_percent == pytest.approx(100 * 4e7 * 3 * (2 + detach_seconds()) / 30e9)


def test_unpriced_memleak_leaves_the_fallback_rule_false_not_missing():
    from memdiag.diagnose.observe import Observation
    from memdiag.rules.engine import run_rules

    fake = FakeProbes()
    e = engine(fake)
    obs = Observation(target=e.target, requested_s=30.0, started=0.0, ended=1.0, snapshots=[], oom_kills=[])
    facts, _c, _t = e.facts_of(obs)
    assert facts["alloc.tracing"] == "none" and "alloc.rate" not in facts
    states = {rule.id: o.state for rule, o in run_rules(e.rules, facts)}
    assert states["memleak-over-budget"] == "not-fired"  # a report's trail lists no skipped rule for it
    e.plans["memleak"] = decision("unknown", "no allocator found")
    facts, _c, _t = e.facts_of(obs)
    states = {rule.id: o.state for rule, o in run_rules(e.rules, facts)}
    assert states["memleak-over-budget"] == "fired"


def test_what_runs_in_a_plans_place_is_priced_itself_and_in_the_trail():
    """A JVM's recording over the budget: the playbook's class histograms run in its place, and
    they are priced first like any probe with a plan (once they were queued unpriced)."""
    from memdiag.probes.jvm.histogram import HistogramPlan
    from memdiag.probes.jvm.plan import JfrPlan

    fake = FakeProbes()
    plans = {
        "jfr": JfrPlan(go=False, state="over-budget", reason="1.5 s start > 600 ms",
                       facts={"jfr.plan": "over-budget", "jfr.not_run": "over"}),
        "histogram": HistogramPlan(go=True, state="full", reason="2 x 60 ms <= 600 ms",
                                   facts={"histogram.plan": "full"}),
    }  # fmt: skip
    priced: list[str] = []

    def planner(name: str, ctx: Context):
        priced.append(name)
        return plans[name]

    e = Engine(load_rules(), Target.for_pid(7, "java"), 30.0, 2.0, clock=fake.clock, runner=fake.run, planner=planner)
    e.facts = {**e.facts, "target.runtime": "jvm"}
    fake.now += 5
    e.run_requests([("jfr", None, "java-heap-grows")])
    assert priced == ["jfr", "histogram"]
    assert [(n, s) for n, s, _ in trail(e, "budget")] == [("jfr", "over-budget"), ("histogram", "full")]
    assert "in its place the playbook runs histogram" in trail(e, "budget")[0][2]
    assert [n for n, _ in fake.runs] == ["histogram"]
    # over the budget too: nothing runs, and the trail says both
    fake2 = FakeProbes()
    plans["histogram"] = HistogramPlan(go=False, state="over-budget", reason="2 x 400 ms > 600 ms",
                                       facts={"histogram.plan": "over-budget"})  # fmt: skip
    e2 = Engine(load_rules(), Target.for_pid(7, "java"), 30.0, 2.0, clock=fake2.clock, runner=fake2.run,
                planner=planner)  # fmt: skip
    e2.facts = {**e2.facts, "target.runtime": "jvm"}
    e2.run_requests([("jfr", None, "java-heap-grows")])
    assert [(n, s) for n, s, _ in trail(e2, "budget")] == [("jfr", "over-budget"), ("histogram", "over-budget")]
    assert fake2.runs == []


def test_a_trace_as_short_as_the_shortest_burst_is_checked_before_it_ends():
    # the meter's check at 0.5 s came after a 0.5 s trace had run out, with what the target really
    # paid past the pause kept for the scan; a trace of a few checks' length is checked more often
    from memdiag.probes.memleak.meter import CHECK_S, check_s

    assert check_s(MIN_BURST_S) < MIN_BURST_S and MIN_BURST_S / check_s(MIN_BURST_S) >= 4
    assert check_s(MIN_TRACE_S) == CHECK_S  # a trend's trace keeps the usual tick


def test_a_probe_asked_for_a_process_of_a_cgroup_target_runs_on_that_process():
    """cgroup-grower-traced names the process that grew the cgroup: memleak is priced and run on it,
    held as a --pid target is (this test's own process, in its own memory cgroup); a process not in
    the cgroup is refused, the trail saying why, and memleak is then asked for the cgroup itself as
    before (rss-climbing: priced, and refused for a cgroup, what runs in its place runs)."""
    import os

    from memdiag.system.cgroup import locate_memory_cgroup

    here = locate_memory_cgroup(os.getpid())
    if here is None:
        pytest.skip("no memory controller mounted")
    fake, aimed_at = FakeProbes(), []

    def planner(name: str, ctx: Context) -> MemleakPlan:
        aimed_at.append(e.aim(name))
        return decision("full", "priced")

    e = Engine(load_rules(), Target.for_cgroup(here), 30.0, 2.0, clock=fake.clock, runner=fake.run, planner=planner)
    grown = {"target.kind": "cgroup", "cgroup.usage_shape": "climbing", "cgroup.top_grower_share": 90.0}
    requests = e.evaluate({**grown, "cgroup.top_grower_pid": str(os.getpid())})
    assert ("memleak", 12.0, "cgroup-grower-traced") in requests
    e.run_requests(requests)
    assert [t.pid for t in aimed_at] == [os.getpid()] and aimed_at[0].start_ticks is not None
    ran = [r for r in trail(e, "probe") if r[0] == "memleak"]
    assert ran and f"on PID {os.getpid()} " in ran[0][2] and "named by cgroup.top_grower_pid" in ran[0][2], ran
    other = Engine(load_rules(), Target.for_cgroup(here), 30.0, 2.0, clock=fake.clock, runner=fake.run)
    outside = 1 if 1 not in other.target.pids() else None
    if outside is None:
        pytest.skip("pid 1 shares this test's memory cgroup")
    asked = other.evaluate({**grown, "cgroup.top_grower_pid": "1"})
    assert [r for r in asked if r[0] == "memleak"] == [("memleak", 12.0, "rss-climbing")]
    assert "memleak" not in other.aimed
    refused = [r for r in trail(other, "probe") if r[0] == "memleak"]
    assert refused and refused[0][1] == "not-run" and "PID 1 is not in" in refused[0][2], refused
