"""BENCHMARKS.md section 8: JVM targets. What the JVM's flight recording costs the target, measured on
the target (its CPU time, utime + stime, in windows without memdiag before and after each recording:
interleaved, so the target's own drift shows), against what the probe measured and what its plan
estimated; the pause of the recording's stop (the JVM's safepoint time while JFR.stop ran, from its
counters); and the verdicts of the JVM scenarios of the test suite. Imported by scripts/bench.py."""

from __future__ import annotations

import json
import statistics
import subprocess
import time
from pathlib import Path

from jvmkit import JavaWorkload, have_jdk, wait_warmed_up
from kit import MEMDIAG
from memdiag.system.process import cpu_seconds

WINDOW_S = 10  # each window: bare, recorded, bare
TARGET = ("OrderService", ["1000"], ["-Xmx512m"])  # the seed's order service: ~2 MiB/s retained
SCENARIOS = (  # (name, main, args, flags, verdict kind, named in it, --budget)
    ("static retry list", "OrderService", ["1000"], ["-Xmx512m"], "growth", "OrderService.retryQueue", "10"),
    ("bounded LRU cache", "LruCache", ["1000", "4000"], ["-Xmx1g"], "cache", "LruCache.cache", "10"),
    ("heap near -Xmx", "HeapThrash", [], ["-Xmx128m"], "pressure", "pressure inside the Java heap", "10"),
    ("JNI native leak", "NativeLeak", ["2000"], ["-Xmx256m"], "leak", "stash_record", "10"),
    # at the default budget the recording is over it: the class histograms run in its place
    ("static retry list", "OrderService", ["1000"], ["-Xmx512m"], "growth", "live byte[] objects grew", "2"),
    ("bounded LRU cache", "LruCache", ["1000", "4000"], ["-Xmx1g"], "cache", "between two class histograms", "2"),
)
JVM_PROBES = ("jfr", "histogram")


def _fmt(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "–"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _cpu_over(pid: int, seconds: float) -> float:
    a = cpu_seconds(pid) or 0.0
    time.sleep(seconds)
    return (cpu_seconds(pid) or a) - a


# the class histograms run alone get the default 2% of their own run: 30 s pays for two looks at OrderService
HISTOGRAM_S = 30
KINDS = ("cold", "warm", "histogram")


def _probed(pid: int, kind: str) -> tuple[dict, float]:
    """`memdiag probe jfr` for WINDOW_S (or histogram for HISTOGRAM_S) on pid: its JSON result and the
    target's CPU seconds meanwhile."""
    how = ["histogram", "--duration", str(HISTOGRAM_S)] if kind == "histogram" else [
        "jfr", "--duration", str(WINDOW_S), "--budget-ms", "60000"]  # fmt: skip
    a = cpu_seconds(pid) or 0.0
    done = subprocess.run(
        [MEMDIAG, "probe", how[0], "--pid", str(pid), *how[1:], "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return json.loads(done.stdout), (cpu_seconds(pid) or a) - a


def _pause_ms(res: dict) -> float:
    """The stop's pause (a recording) or the longer look's (the class histograms)."""
    pauses = [s for s in res.get("pauses_s", [res.get("stop_pause_s")]) if s is not None]
    return 1000 * max(pauses, default=0.0)


def _one_jvm(runs: dict[str, list[float]]) -> None:
    """A fresh JVM: bare, a cold recording, bare, a warm recording, bare, two class histograms, bare."""
    main, args, flags = TARGET
    w = JavaWorkload(main, *args, jvm=flags).start()
    try:
        wait_warmed_up(w.pid)  # past its start-up: the JIT's first compilations
        for kind in KINDS:
            before = _cpu_over(w.pid, WINDOW_S)
            res, during = _probed(w.pid, kind)
            after = _cpu_over(w.pid, WINDOW_S)
            if res.get("status") not in ("ok", "partial"):
                continue
            # the probe's run lasts longer than WINDOW_S (start, stop, reading): its own duration
            bare_rate = (before + after) / (2 * WINDOW_S)
            lost = during - bare_rate * res["duration_s"]
            runs[f"{kind}_lost"].append(lost * 1000)
            runs[f"{kind}_reported"].append(res["measured_ns"] / 1e6)
            if res.get("start_cpu_s") is not None:
                runs[f"{kind}_start"].append(res["start_cpu_s"] * 1000)
            runs[f"{kind}_pause"].append(_pause_ms(res))
            runs[f"{kind}_bare"].append(bare_rate * 100)
    finally:
        w.stop()


def _scenario(name: str, main: str, args: list[str], flags: list[str], kind: str, named: str, budget: str) -> list[str]:
    w = JavaWorkload(main, *args, jvm=flags).start()
    out = Path(f"/tmp/memdiag-bench-jvm-{main}")
    try:
        wait_warmed_up(w.pid)  # as the tests do: past its start-up's compiling
        t0 = time.monotonic()
        subprocess.run([MEMDIAG, "--pid", str(w.pid), "--duration", "30", "--budget", budget, "--output", str(out)],
                       capture_output=True, timeout=240, check=False)  # fmt: skip
        took = time.monotonic() - t0
        rep = json.loads((out / "report.json").read_text())
    finally:
        w.stop()
        subprocess.run(["rm", "-rf", str(out)], check=False)
    v = rep["verdict"]
    ok = "yes" if v["kind"] == kind and named in v["summary"] else "**no**"
    ran = [p for p in rep["probes"] if p["name"] in JVM_PROBES and p.get("overhead_percent") is not None]
    cost = ", ".join(f"{p['name']} {p['overhead_percent']:.2f}%" for p in ran) or "none ran"
    measured = rep["overhead"]["measured_percent"] or 0
    return [f"| {name} | {budget}% | {v['kind']} | {ok} | {cost} | {measured:.2f}% | {took:.0f} s |"]


def jvm_section(runs_per_figure: int) -> list[str]:
    """Section 8 of BENCHMARKS.md."""
    title = "## 8. JVM targets: what the flight recording and the class histograms cost the target"
    if not have_jdk():
        return [title, "", "No JDK on this machine (scripts/setup.sh --test installs openjdk-17): not measured.", ""]
    runs: dict[str, list[float]] = {
        f"{k}_{f}": [] for k in KINDS for f in ("lost", "reported", "start", "pause", "bare")
    }
    for _ in range(runs_per_figure):
        _one_jvm(runs)
    lines = [
        title,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Target: the kit's `OrderService 1000` "
        f"(`-Xmx512m`, 1,000 batches/s, ~2 MiB/s retained), a fresh JVM per run; `memdiag probe jfr --duration "
        f"{WINDOW_S}`, first in a JVM where JFR never ran (cold: JFR JIT-compiles its own code), then again (warm). "
        f"Lost: the target's CPU time (utime + stime) during the probe's run above its rate in the {WINDOW_S} s "
        "windows without memdiag just before and just after. Reported: what the probe measured (its CPU clock "
        "above the rate before it). Stop pause: the JVM's safepoint time while JFR.stop ran (its counters), "
        "which includes the search of the old objects' paths to GC roots. Then, in the same JVM, `memdiag probe "
        f"histogram --duration {HISTOGRAM_S}`: two class histograms (jcmd GC.class_histogram, each a full "
        "collection), its pause the longer look's safepoint time.",
        "",
        "| JVM probe | target's CPU bare | lost (measured here) | reported by the probe | of it, the start | pause |",
        "|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        what = "two class histograms" if kind == "histogram" else f"{kind} start"
        start = f"{_fmt(runs[f'{kind}_start'])} ms" if runs[f"{kind}_start"] else "–"
        lines.append(
            f"| {what} | {_fmt(runs[f'{kind}_bare'], '{:.1f}')}% of a CPU | {_fmt(runs[f'{kind}_lost'])} ms | "
            f"{_fmt(runs[f'{kind}_reported'])} ms | {start} | "
            f"{_fmt(runs[f'{kind}_pause'], '{:.1f}')} ms |"
        )
    lines += [
        "",
        "The JVM scenarios of the test suite (tests/e2e/test_jvm.py), 30 s window, at `--budget 10` and at the "
        f"default 2% (a cold start, {_fmt(runs['cold_start'])} ms of the target's CPU above, is over 2% of a 30 s "
        "window, 600 ms: the playbook runs two class histograms, each a full collection, in its place). The JVM "
        "probe's cost: what it measured on the target, as a share of the window:",
        "",
        "| scenario | budget | verdict | right kind, named | JVM probe's cost | measured overhead | wall |",
        "|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        lines += _scenario(*scenario)
    return lines + [""]
