"""What allocation tracing costs, priced per site and measured on the real target: the figure
memleak reports is checked against the time the target itself lost (bench_alloc times its own
operations), on glibc (emulated probes) and jemalloc (single-stepped ones), and the running check
detaches when the measured cost reaches what the budget leaves."""

import json
import time

import pytest
from kit import BenchAlloc
from memdiag.probes import memleak
from memdiag.probes.allocator import find_allocator
from memdiag.probes.memleak.costs import host_costs
from memdiag.probes.memleak.meter import price
from memdiag.probes.memleak.ratecount import estimate_call_rates
from memdiag.system import arch
from memdiag.system.process import cpu_seconds
from memdiag.system.target import Target

pytestmark = pytest.mark.alone  # the target's own CPU clock is the measure: the machine to itself

JEMALLOC = arch.library("libjemalloc.so.2")


@pytest.fixture
def bench(root_required):
    started: list[BenchAlloc] = []

    def start(rate: int, env: dict | None = None) -> BenchAlloc:
        b = BenchAlloc(rate, env=env).start()
        started.append(b)
        return b

    yield start
    for b in started:
        b.stop()


def _traced(b: BenchAlloc, seconds: float, **kw):
    """The call rates counted by entry point, as a diagnosis's plan counts them before memleak;
    then an untraced baseline for 3 s, memleak for `seconds` (given those rates, as a diagnosis
    gives them: a program on several sites, free_enter on free and operator delete, is priced by
    their counted hits; without them at the dearest site's trap), then 2 s untraced; the result and
    the target's own account of what it lost (ns), by its thread's CPU clock (traps are charged
    to it; what other processes take from it on this 2-core machine is not)."""
    counted = estimate_call_rates(b.pid)
    assert counted is not None
    kw.setdefault("site_rates", counted.per_s())
    t0, c0 = time.monotonic(), cpu_seconds(b.pid)
    time.sleep(3.2)
    base = b.ns_per_op(t0 + 0.5, time.monotonic() - 1.0, cpu=True)
    baseline = (cpu_seconds(b.pid) - c0) / (time.monotonic() - t0)
    start = time.monotonic()
    r = memleak.run(Target.for_pid(b.pid), seconds, costs=host_costs(), cpu_baseline=baseline, **kw)
    end = time.monotonic()
    time.sleep(2.2)
    assert base is not None and r.status == "ok", r.reason
    return r, b.lost_ns(start, end, base, cpu=True)


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_measured_cost_agrees_with_what_the_target_lost(bench, allocator):
    env = {"LD_PRELOAD": JEMALLOC} if allocator == "jemalloc" else None
    b = bench(10_000 if allocator == "glibc" else 2_000, env=env)
    r, lost = _traced(b, 5)
    assert r.allocator == allocator
    cost = r.tracing_cost
    assert cost is not None and cost.probes_ns is not None and cost.cpu_ns is not None
    # the figure reported within a factor of 1.5 of the target's own account; each of the two ways
    # within the factor of 2 the report's figure lets one raise the other by (the probes' count uses
    # trap costs calibrated earlier: on a noisy host it read 179 ms where the target lost 278 ms and
    # its CPU time above its rate 273 ms, which the report then stated)
    assert lost / 1.5 <= cost.measured_ns <= lost * 1.5, (cost, lost)
    for figure in (cost.probes_ns, cost.cpu_ns):
        assert lost / 2 <= figure <= lost * 2, (cost, lost)
    if allocator == "jemalloc":  # no emulated instruction at the start of malloc or free
        assert any(p.startswith("malloc+0") and "single-stepped" in p for p in r.placements), r.placements


def test_the_probe_run_alone_states_what_the_target_lost(bench, memdiag):
    """`memdiag probe memleak` run by itself counts the call rates as a diagnosis's plan does, so
    the program shared by free and operator delete is priced by their hits, not at the dearest
    site's trap (under jemalloc that read 1.68x what the target lost)."""
    b = bench(2_000, env={"LD_PRELOAD": JEMALLOC})
    t0 = time.monotonic()
    time.sleep(3.2)
    base = b.ns_per_op(t0 + 0.5, time.monotonic() - 1.0, cpu=True)
    start = time.monotonic()
    r = memdiag("probe", "memleak", "--pid", str(b.pid), "--duration", "5", "--json")
    end = time.monotonic()
    time.sleep(2.2)
    assert r.returncode == 0 and base is not None, r.stderr
    data = json.loads(r.stdout)
    assert data["allocator"] == "jemalloc", data["allocator"]
    lost = b.lost_ns(start, end, base, cpu=True)
    measured = data["tracing_cost"]["measured_ns"]
    assert lost / 1.5 <= measured <= lost * 1.5, (data["tracing_cost"], lost)


def test_detaches_when_the_measured_cost_reaches_the_allowance(bench):
    b = bench(10_000)
    # 2 s of tracing at 10 thousand calls/s, as this host's traps price it (40 ms was 1.5 s of it on
    # one host and 0.7 s on one whose traps cost twice: under the first check's tick)
    rates = {"malloc": 10_000.0, "free": 10_000.0}
    allowance = 2 * price(find_allocator(b.pid).placements, rates, host_costs()).ns_per_s
    r, lost = _traced(b, 10, allowance_ns=allowance)
    assert r.backed_off and r.duration_s < 5, r.duration_s
    # a tick (0.5 s) of overshoot at most, and the target's own account agrees with that figure as
    # closely as test_measured_cost_agrees_with_what_the_target_lost asks (a factor of 1.5: on a host
    # whose traps cost twice, memleak measured 58 ms and the target lost 62 ms)
    measured = r.tracing_cost.measured_ns
    assert measured <= allowance * 1.5, r.tracing_cost
    assert lost <= measured * 1.5, (lost, r.tracing_cost)


def test_price_is_per_site(root_required, bench):
    """glibc's malloc and free sit on emulated instructions; under jemalloc malloc is single-stepped
    (its first instruction reads the size and a return probe keeps it at +0) and free is placed on its
    first branch, which the kernel emulates: each site priced at its own instruction's trap. How much
    dearer the stepped trap is: this host's measured costs decide (3.6x on one machine, ~30x on
    another), never a ratio the test assumes."""
    costs = host_costs()
    glibc = find_allocator(bench(1000).pid)
    jemalloc = find_allocator(bench(1000, env={"LD_PRELOAD": JEMALLOC}).pid)
    rates = {"malloc": 1000.0, "free": 1000.0}
    cheap, dear = price(glibc.placements, rates, costs), price(jemalloc.placements, rates, costs)
    assert "single-stepped" in dear.describe() and "single-stepped" not in cheap.describe()
    by = {name: {s.placement.function: s for s in p.sites} for name, p in (("glibc", cheap), ("jemalloc", dear))}
    assert not by["jemalloc"]["malloc"].placement.emulated and by["jemalloc"]["free"].placement.emulated
    assert by["jemalloc"]["free"].placement.offset > 0  # past the movs that build its rtree key
    ret = costs.return_ns + costs.program_ns["alloc_return"]

    def trap(name: str, function: str) -> float:
        return costs.emulated_ns if by[name][function].placement.emulated else costs.stepped_ns

    for name in ("glibc", "jemalloc"):
        # each site at its own trap, plus memleak's program, plus the return probe where it has one
        assert by[name]["free"].ns == trap(name, "free") + costs.program_ns["free_enter"], name
        assert by[name]["malloc"].ns == trap(name, "malloc") + costs.program_ns["malloc_enter"] + ret, name
    # the two allocators differ by malloc's trap alone: jemalloc's is stepped, glibc's emulated
    programs = costs.program_ns["free_enter"] + costs.program_ns["malloc_enter"] + ret
    expected = (costs.stepped_ns + costs.emulated_ns + programs) / (2 * costs.emulated_ns + programs)
    assert costs.stepped_ns > costs.emulated_ns  # single-stepping does more work than emulating
    assert dear.ns_per_s / cheap.ns_per_s == pytest.approx(expected, rel=1e-9), (cheap.describe(), dear.describe())
