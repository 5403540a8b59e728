"""The budget holds on the target's own clock: a whole diagnosis (30 s window, 2% budget) of
bench_alloc, which times its own allocation batches, at an allocation rate memleak is admitted at
on this host (glibc, emulated probes; its own plan finds the rate), at 100k/s (glibc) and 10k/s
(jemalloc) where the whole window
is over the budget (jemalloc: single-stepped probes, 7-15 µs a call) and memleak traces for the
seconds the budget pays for, its scan's pause kept, and at 100k/s under jemalloc and flat out
under glibc, where it is refused and the faulting function's own calls are traced (sites; under
jemalloc with every free of the process, at an emulated trap). The time the target lost
over the window, by its own thread's CPU clock (traps are charged to it; what memdiag and other
processes take from it on this 2-core machine is not), stays within the budget and the report's
overhead figure agrees with it."""

import json
import re
import time

import pytest
from kit import BenchAlloc
from memdiag.probes.face import Budget, Context
from memdiag.probes.memleak.plan import plan
from memdiag.system import arch
from memdiag.system.target import Target

pytestmark = pytest.mark.alone  # the target's own CPU clock is the measure: the machine to itself

JEMALLOC = arch.library("libjemalloc.so.2")


WINDOW = Budget(percent=2.0, window_s=30.0)  # the diagnosis's defaults


def admitted_rate(start: int = 10_000, share: float = 0.6) -> int:
    """An allocation rate memleak's own plan admits on this host, at about `share` of the budget
    (glibc). The rate is the host's: a trap here costs 633 ns on one host and 1,399 on another
    (BENCHMARKS.md section 3), and 10k/s was admitted on the first (1.91% reported) but priced at
    2.35% on the second. Priced as the diagnosis prices it: for the 12 s the rule asks."""
    rate = start
    for _ in range(4):
        b = BenchAlloc(rate).start()
        try:
            time.sleep(2.0)
            p = plan(Target.for_pid(b.pid, "bench_alloc"), Context(seconds=12.0, budget=WINDOW))
        finally:
            b.stop()
        assert p.estimated_percent, p.reason
        if p.state == "full" and p.estimated_percent <= 0.8 * WINDOW.percent:
            return rate
        rate = max(500, int(rate * share * WINDOW.percent / p.estimated_percent) // 100 * 100)
    raise AssertionError(f"no rate admitted: {p.reason}")


@pytest.mark.parametrize(
    ("rate", "allocator", "decision"),
    [
        (None, "glibc", "full"),
        (100_000, "glibc", "full"),
        (10_000, "jemalloc", "full"),
        (100_000, "jemalloc", "fallback"),
        (0, "glibc", "fallback"),
    ],
)
def test_the_target_loses_no_more_than_the_budget(root_required, memdiag, tmp_path, rate, allocator, decision):
    rate = admitted_rate() if rate is None else rate
    b = BenchAlloc(rate, env={"LD_PRELOAD": JEMALLOC} if allocator == "jemalloc" else None).start()
    try:
        # The untraced cost is taken on both sides of the run, 6 s each: flat out, one second's cost
        # varies by 3% here with nothing traced (6.53-7.26 ns per operation over 40 s), and the
        # 2 s taken before alone made the loss swing by more than the budget.
        time.sleep(7.5)
        first = (time.monotonic() - 7.0, time.monotonic() - 1.0)
        before = b.ns_per_op(*first, cpu=True)
        start = time.monotonic()
        r = memdiag("--pid", str(b.pid), "--output", str(tmp_path), timeout=240)
        end = time.monotonic()
        time.sleep(8.5)
        after = b.ns_per_op(end + 1.5, end + 7.5, cpu=True)
        untraced = b.per_second(*first, cpu=True) + b.per_second(end + 1.5, end + 7.5, cpu=True)
        assert r.returncode == 0, r.stderr
        base = (before + after) / 2
        lost_ns = b.lost_ns(start, end, base, cpu=True)  # over the whole run, start-up and report included
    finally:
        b.stop()
    rep = json.loads((tmp_path / "report.json").read_text())
    lost = 100 * lost_ns / ((rep["window"]["ended"] - rep["window"]["started"]) * 1e9)  # as the budget's
    budget = next(t for t in rep["trail"] if t["kind"] == "budget")
    assert budget["state"] == decision, budget["reason"]
    if allocator == "jemalloc":
        assert "single-stepped" in budget["reason"], budget["reason"]
    if allocator == "jemalloc" and decision == "full":
        assert "traced for those" in budget["reason"] and "kept for the reachability scan" in budget["reason"]
    reported = rep["overhead"]["measured_percent"]
    drift = 100 * abs(after - before) / base  # how far its own untraced clock moved across the run
    # and how far its untraced seconds spread, one from another: flat out, CI once saw the run 8.35%
    # above the two windows (6.6% apart) with memleak refused and 0.29% reported; the hypervisor's
    # share of this 2-vCPU guest moves the target's clock in steps of seconds
    spread = 100 * (max(untraced) - min(untraced)) / base
    print(f"lost {lost:.2f}% by the target's CPU clock, reported {reported:.2f}%, base {base:.2f} ns/op "
          f"({before:.2f} before, {after:.2f} after: {drift:.1f}% apart; its seconds {spread:.1f}% apart)")  # fmt: skip
    # What the target's own clock can tell apart. Throttled, untraced seconds agree within 0.05%; flat
    # out they do not: BENCHMARKS.md section 1 finds the untraced ("bare") flat-out loss in -2.6%..+2.6%
    # over a 30 s run on one host and in -42%..-4% on another (2026-12-01), where this case measured
    # 5.9% and -9.9% lost with 0.13-0.15% reported (memleak not attached, nothing trapping) and its
    # untraced cost moved 10% between the 6 s before and the 6 s after. A flat-out target is judged
    # within the noise its own clock shows across the run, at least 2.6%: memleak attached to it
    # would cost it over 95% (section 1).
    # Throttled, its clock is read to the 0.05% its untraced seconds agree within (CI once measured
    # 2.019% against the 2% budget: 6 ms over the window, below what the clock tells apart).
    noise = max(2.6, drift, spread) if rate == 0 else 0.05
    assert lost <= rep["overhead"]["budget_percent"] + noise, (lost, rep["probes"])
    if rate != 0:  # the figure stated is the target's own, within a factor of 1.5
        assert lost / 1.5 <= reported <= lost * 1.5, (lost, reported)
        assert "leak_bench_records" in rep["verdict"]["summary"], rep["verdict"]
    if decision == "fallback":  # every call is over the budget: only the faulting function's own calls are traced
        refused, cut = _pause_refused(rep), _cut_at_pause(rep)
        if rate == 0 and (refused is not None or cut):
            # Flat out, the target grows 1.1 GiB/min and holds 400-650 MiB by the time its calls are
            # traced: whether a scan of that fits 2% of 30 s is this host's memory speed (sampled on the
            # target at 0.76-1.1 GiB/s here on one day). Where it does not, the scan is refused for
            # its pause, said with both figures, and the function is named by its faults. A price is
            # sampled a moment before the stop, and this host's speed moves by up to a third from one
            # second to the next (CI's alone phase: priced under the 536 ms allowed, 368.5 of 388.9 MiB
            # read at it): such a scan stops at the pause allowed, concludes nothing, and the same verdict follows
            if refused is not None:
                priced_ms, allowed_ms = refused
                assert priced_ms > allowed_ms, refused
            assert rep["verdict"]["kind"] == "growth" and "leak_bench_records" in rep["verdict"]["summary"], rep[
                "verdict"
            ]["summary"]
        else:
            assert rep["verdict"]["kind"] == "leak" and "leak_bench_records" in rep["verdict"]["summary"], (
                rep["verdict"]["summary"],
                [t for t in rep["trail"] if t["kind"] in ("probe", "scan")],
            )
        probes = [t["name"] for t in rep["trail"] if t["kind"] == "probe" and t["state"] == "ok"]
        assert probes[-2:] == ["faults", "sites"], probes
        sites = next(p for p in rep["probes"] if p["name"] == "sites")
        if allocator == "jemalloc":  # its frees traced too: at 100k/s, hundreds of thousands
            assert "frees of the process" in sites["reason"] and "jemalloc's free entry points" in sites["method"]
    if rate in (100_000, 10_000):  # a fraction of the window traced, its scan ending it: the leak is a leak
        # (10k/s under jemalloc: the scan's pause is priced again while traced, as the target grows,
        # and jemalloc's own records are no roots; it came out growth, the scan priced out, before)
        assert rep["verdict"]["kind"] == "leak", (
            rep["verdict"]["summary"],
            [t for t in rep["trail"] if t["kind"] == "scan"],
        )
    if rate != 100_000 or decision == "fallback":  # tracepoint probes report their BPF run time host-wide
        assert reported <= rep["overhead"]["budget_percent"], rep["probes"]
        assert reported >= lost - max(1.0, noise), (lost, reported)  # never understated beyond the noise


def _cut_at_pause(rep: dict) -> bool:
    """The scan ran and stopped at the pause allowed, resuming the target and concluding nothing."""
    scan = next((t for t in rep["trail"] if t["kind"] == "scan"), None)
    why = (scan or {}).get("reason") or ""
    return scan is not None and scan["state"] == "failed" and "pause allowed, after" in why and "nothing" in why


def _pause_refused(rep: dict) -> tuple[float, float] | None:
    """The scan's priced and allowed pause, in ms, where it was skipped for its pause; else None."""
    scan = next((t for t in rep["trail"] if t["kind"] == "scan"), None)
    m = re.search(r"pause the target ~([\d.,]+) (ms|s) > ([\d.,]+) (ms|s) allowed", (scan or {}).get("reason") or "")
    if scan is None or scan["state"] != "skipped" or m is None:
        return None
    ms = {"ms": 1.0, "s": 1000.0}
    return float(m[1].replace(",", "")) * ms[m[2]], float(m[3].replace(",", "")) * ms[m[4]]
