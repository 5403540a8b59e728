"""fdstack and kmemstack priced before they attach, on the real kernel: their tracepoints counted by
counting perf events (no program attached) see a workload's own calls at the rate it makes them, and
a budget too small for the host's traffic leaves the probe unattached with its price said."""

import os

import pytest
from memdiag.probes import fdstack, hostwide, kmemstack, tpcount
from memdiag.probes.face import Budget, Context
from memdiag.system.target import Target

RATE = 1000  # lookups a second
SESSIONS = 50  # fdleak's sessions a second
# fdleak, every 5th handshake failing: per session a socketpair, a pipe and an eventfd, and 8 closes
# (3 when the handshake fails): 7.6 calls fdstack records; a write, a read (not when it fails) and a
# sleep besides: 10.4 syscalls in all
RECORDED, ALL = 7.6, 10.4


def test_a_processs_slab_allocations_are_counted_at_the_rate_it_makes_them(workload, tmp_path):
    w = workload("lookups", str(tmp_path), str(RATE))
    c = tpcount.count(("kmem:kmem_cache_alloc", "kmem:kmalloc"), 1.0, (w.pid,), own=("kmem:kmem_cache_alloc",))
    assert isinstance(c, tpcount.TracepointCount), c
    # each stat() of a new name takes a names_cache buffer and leaves a dentry: two kmem_cache_allocs.
    # The workload sleeps 10 ms every RATE/100 lookups: a little under RATE a second, never over.
    own = c.target_per_s("kmem:kmem_cache_alloc")
    assert 0.7 * 2 * RATE <= own <= 1.05 * 2 * RATE, own
    assert set(c.target) == {"kmem:kmem_cache_alloc"} and c.threads == 1
    assert c.host_per_s("kmem:kmem_cache_alloc") >= own  # the host's count is every CPU's, the target's among them


def test_only_the_calls_fdstack_records_are_counted_as_the_targets(workload):
    w = workload("fdleak", str(SESSIONS), "5")
    recorded = tpcount.count(("raw_syscalls:sys_enter",), 1.0, (w.pid,), fdstack._target_filter())
    every = tpcount.count(("raw_syscalls:sys_enter",), 1.0, (w.pid,))
    assert isinstance(recorded, tpcount.TracepointCount) and isinstance(every, tpcount.TracepointCount)
    assert recorded.unfiltered == []
    rec, all_ = recorded.target_per_s("raw_syscalls:sys_enter"), every.target_per_s("raw_syscalls:sys_enter")
    assert rec <= 1.05 * RECORDED * SESSIONS, rec
    assert RECORDED / ALL - 0.07 <= rec / all_ <= RECORDED / ALL + 0.07, (rec, all_)


def test_an_idle_process_has_none_of_the_hosts_events(workload, tmp_path):
    workload("lookups", str(tmp_path), str(RATE))  # another process's
    c = tpcount.count(("kmem:kmem_cache_alloc",), 0.5, (os.getpid(),))
    assert isinstance(c, tpcount.TracepointCount), c
    assert c.host_per_s("kmem:kmem_cache_alloc") >= 0.7 * 2 * RATE
    assert c.target_per_s("kmem:kmem_cache_alloc") < 0.05 * 2 * RATE  # this test sleeps meanwhile


@pytest.mark.parametrize("pricing", [fdstack.PRICING, kmemstack.PRICING], ids=["fdstack", "kmemstack"])
def test_a_tiny_budget_prices_it_out_before_anything_is_attached(workload, tmp_path, pricing):
    w = workload("lookups", str(tmp_path), str(RATE))
    target = Target.for_pid(w.pid)
    out = hostwide.plan(pricing, target, Context(seconds=6.0, budget=Budget(percent=0.001, window_s=15.0)))
    assert not out.go and out.state == "over-budget", out.reason
    assert out.facts[f"{pricing.probe}.not_run"] == out.reason and "> budget 0.001%" in out.reason
    assert out.estimated_percent > 0.001 and out.ns_per_s > 0
    whole = hostwide.plan(pricing, target, Context(seconds=6.0, budget=Budget(percent=100.0, window_s=15.0)))
    assert whole.go and whole.state == "full", whole.reason
    if pricing is kmemstack.PRICING:  # the target's own allocations are priced as recorded
        assert whole.target_per_s >= 0.7 * 2 * RATE, whole.reason


def test_prepare_measures_what_each_program_costs_per_event_here(tmp_path):
    costs = hostwide.measure(tmp_path / "hostwide-costs.json")
    assert costs is not None
    programs = {f for p in (fdstack.PRICING, kmemstack.PRICING) for fs in p.programs.values() for f in fs}
    assert set(costs.program_ns) == programs and all(ns > 0 for ns in costs.program_ns.values()), costs
    assert all(costs.runs[f] > 0 for f in programs)
    # recording one of the target's events walks its stacks and keeps its books: more than a filter
    assert costs.recorded_ns["fdstack"] > costs.program_ns["raw_tracepoint__sys_exit"]
    assert costs.recorded_ns["kmemstack"] > costs.program_ns["tracepoint__kmem__kmem_cache_alloc"]
    # kept for the plans: the same figures read back (this host's key)
    assert hostwide.cached_costs(tmp_path / "hostwide-costs.json") == costs
