"""The price of a host-wide probe (fdstack, kmemstack) before it attaches, from a count of its
tracepoints given by a counter of the test's own (the seam probes/hostwide.py plan() takes): every
event of the host times what it costs the programs, the target's recorded events times what
recording adds, over the time it would run, against the budget as a share of one CPU."""

import os

import pytest
from memdiag.probes import fdstack, hostwide, kmemstack
from memdiag.probes.face import Budget, Context
from memdiag.probes.tpcount import TracepointCount
from memdiag.system.target import Target

SYS = "raw_syscalls:sys_enter"
MEASURED = hostwide.HostCosts(
    host="test", program_ns={"raw_tracepoint__sys_enter": 30.0, "raw_tracepoint__sys_exit": 40.0}
)  # what recording one of the target's calls adds: not measured here, the prior (355 ns)


class Counter:
    """Returns a fixed count and keeps what it was asked."""

    def __init__(self, answer):
        self.answer, self.asked = answer, []

    def __call__(self, tracepoints, seconds, pids, filters, own):
        self.asked.append((tracepoints, seconds, pids, filters, own))
        return self.answer


def _count(host: dict, target: dict, seconds: float = 0.5) -> TracepointCount:
    return TracepointCount(
        seconds=seconds,
        host={k: int(v * seconds) for k, v in host.items()},
        target={k: int(v * seconds) for k, v in target.items()},
        threads=1,
    )


def _plan(pricing, counter, budget: Budget, seconds: float = 8.0, costs=MEASURED, target=None):
    target = target or Target.for_pid(os.getpid())
    return hostwide.plan(pricing, target, Context(seconds=seconds, budget=budget), counter, lambda: costs)


def test_fdstack_is_priced_by_the_hosts_syscalls_and_the_targets_descriptor_calls():
    counter = Counter(_count({SYS: 100_000}, {SYS: 200}))
    plan = _plan(fdstack.PRICING, counter, Budget(percent=2.0, window_s=15.0))
    # 100k syscalls/s x (30 + 40 ns, both programs) + 200 descriptor calls/s x 355 ns, for 8 s of 15
    ns_per_s = 100_000 * 70 + 200 * 355
    assert plan.ns_per_s == pytest.approx(ns_per_s)
    assert plan.estimated_percent == pytest.approx(100 * ns_per_s * 8 / 15e9)
    assert plan.go and plan.state == "full" and plan.facts["fdstack.plan"] == "full"
    assert "fdstack.not_run" not in plan.facts
    assert "measured on this host by `memdiag prepare`" in plan.reason and "<= budget 2%" in plan.reason
    assert "not by the target alone" in plan.reason
    # counted without attaching: the host's syscalls on every CPU, the target's own kept to the calls recorded
    ((tracepoints, seconds, pids, filters, own),) = counter.asked
    assert tracepoints == (SYS,) and own == (SYS,) and pids == (os.getpid(),) and seconds == hostwide.COUNT_S
    assert filters == fdstack._target_filter() and "id == 41" in filters[SYS] and "id == 3 " in filters[SYS] + " "


def test_over_the_budget_it_is_not_attached_and_the_facts_say_what_it_would_have_cost():
    counter = Counter(_count({SYS: 100_000}, {SYS: 200}))
    plan = _plan(fdstack.PRICING, counter, Budget(percent=0.01, window_s=15.0))
    assert not plan.go and plan.state == "over-budget"
    assert plan.facts["fdstack.plan"] == "over-budget"
    assert plan.facts["fdstack.price_percent"] == pytest.approx(0.37712)
    said = plan.facts["fdstack.not_run"]
    assert said == plan.reason and "0.38% of one CPU over the 15 s window" in said and "> budget 0.01%" in said
    # the rules see it whether or not the probe ran
    assert fdstack.facts_of(None, plan, lambda *_a: None)["fdstack.not_run"] == said


def test_over_the_budget_it_runs_for_the_seconds_the_budget_pays_for():
    counter = Counter(_count({SYS: 100_000}, {SYS: 200}))
    # 7.071 ms a second of its run; 0.2% of 15 s (30 ms) pays for 4.2 s of the 8 asked
    plan = _plan(fdstack.PRICING, counter, Budget(percent=0.2, window_s=15.0))
    assert plan.go and plan.state == "shortened" and plan.seconds == 4.2
    assert plan.estimated_percent == pytest.approx(100 * 7.071e6 * 4.2 / 15e9)
    assert "the budget pays for 4.2 s of it: traced for those (0.20% of the window)" in plan.reason
    assert hostwide.run_seconds(Context(seconds=8.0, plan=plan)) == 4.2
    assert hostwide.run_seconds(Context(seconds=3.0, plan=plan)) == 3.0  # the engine's share, when shorter
    # under the shortest trace worth running: not attached, and why
    out = _plan(fdstack.PRICING, counter, Budget(percent=0.05, window_s=15.0))
    assert not out.go and out.state == "over-budget"
    assert "the budget pays for 1 s of it, under the 2 s a trace needs: not attached" in out.reason


def test_what_the_budget_spent_already_counts():
    counter = Counter(_count({SYS: 100_000}, {SYS: 200}))
    fits = _plan(fdstack.PRICING, counter, Budget(percent=0.4, window_s=15.0))
    spent = _plan(fdstack.PRICING, counter, Budget(percent=0.4, window_s=15.0, spent_ns=10e6))
    assert fits.state == "full" and spent.state == "shortened"
    # 60 ms of the window less the 10 spent pays for 7 s of the 8
    assert spent.seconds == 7.0
    assert spent.estimated_percent == pytest.approx(100 * (7.071e6 * 7 + 10e6) / 15e9)


def test_without_prepares_measurement_the_priors_price_it_and_are_said_to():
    counter = Counter(_count({SYS: 100_000}, {}))
    plan = _plan(fdstack.PRICING, counter, Budget(percent=2.0, window_s=15.0), costs=None)
    assert plan.ns_per_s == pytest.approx(100_000 * 220)  # 110 ns per program run, BENCHMARKS.md section 9
    assert "priors from BENCHMARKS.md section 9" in plan.reason


def test_recording_measured_by_prepare_prices_the_targets_events():
    counter = Counter(_count({SYS: 100_000}, {SYS: 200}))
    measured = MEASURED.model_copy(update={"recorded_ns": {"fdstack": 1000.0}})
    plan = _plan(fdstack.PRICING, counter, Budget(percent=2.0, window_s=15.0), costs=measured)
    assert plan.ns_per_s == pytest.approx(100_000 * 70 + 200 * 1000)
    assert "200/s x 1,000 ns to record each (measured on this host by `memdiag prepare`)" in plan.reason


def test_kmemstack_prices_each_tracepoint_at_its_programs_cost():
    host = {
        "kmem:kmem_cache_alloc": 40_000,
        "kmem:kmalloc": 10_000,
        "kmem:kmem_cache_free": 40_000,
        "kmem:kfree": 10_000,
    }
    counter = Counter(_count(host, {"kmem:kmem_cache_alloc": 2_000, "kmem:kmalloc": 40}))
    plan = _plan(kmemstack.PRICING, counter, Budget(percent=2.0, window_s=30.0), seconds=6.0, costs=None)
    ns_per_s = 40_000 * 50 + 10_000 * 50 + 40_000 * 210 + 10_000 * 70 + 2_040 * 2500
    assert plan.ns_per_s == pytest.approx(ns_per_s)
    assert plan.estimated_percent == pytest.approx(100 * ns_per_s * 6 / 30e9)
    ((_tps, _s, _pids, filters, own),) = counter.asked
    assert own == ("kmem:kmem_cache_alloc", "kmem:kmalloc") and filters == {}


def test_the_whole_system_as_target_prices_every_recorded_event_of_the_host():
    counter = Counter(_count({SYS: 100_000}, {}))
    plan = _plan(fdstack.PRICING, counter, Budget(percent=100.0, window_s=15.0), target=Target(kind="system"))
    assert plan.ns_per_s == pytest.approx(100_000 * (70 + 355))
    assert counter.asked[0][2] == () and "an upper bound" in plan.reason


def test_a_count_that_fails_leaves_it_unpriced_and_not_attached():
    plan = _plan(kmemstack.PRICING, Counter("no tracepoint kmem:kfree under tracefs"), Budget(2.0, 15.0))
    assert not plan.go and plan.state == "unknown"
    assert (
        plan.facts["kmemstack.not_run"]
        == "could not price kmemstack: no tracepoint kmem:kfree under tracefs; not attached"
    )
