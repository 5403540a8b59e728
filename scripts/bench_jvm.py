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
SCENARIOS = (
    ("static retry list", "OrderService", ["1000"], ["-Xmx512m"], "growth", "OrderService.retryQueue"),
    ("bounded LRU cache", "LruCache", ["1000", "4000"], ["-Xmx1g"], "cache", "LruCache.cache"),
    ("heap near -Xmx", "HeapThrash", [], ["-Xmx128m"], "pressure", "pressure inside the Java heap"),
    ("JNI native leak", "NativeLeak", ["2000"], ["-Xmx256m"], "leak", "stash_record"),
)


def _fmt(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "–"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


def _cpu_over(pid: int, seconds: float) -> float:
    a = cpu_seconds(pid) or 0.0
    time.sleep(seconds)
    return (cpu_seconds(pid) or a) - a


def _recorded(pid: int) -> tuple[dict, float]:
    """`memdiag probe jfr` for WINDOW_S on pid: its JSON result and the target's CPU seconds meanwhile."""
    a = cpu_seconds(pid) or 0.0
    done = subprocess.run(
        [MEMDIAG, "probe", "jfr", "--pid", str(pid), "--duration", str(WINDOW_S), "--budget-ms", "60000", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return json.loads(done.stdout), (cpu_seconds(pid) or a) - a


def _one_jvm(runs: dict[str, list[float]]) -> None:
    """A fresh JVM: bare, a cold recording, bare, a warm recording, bare."""
    main, args, flags = TARGET
    w = JavaWorkload(main, *args, jvm=flags).start()
    try:
        wait_warmed_up(w.pid)  # past its start-up: the JIT's first compilations
        for kind in ("cold", "warm"):
            before = _cpu_over(w.pid, WINDOW_S)
            res, during = _recorded(w.pid)
            after = _cpu_over(w.pid, WINDOW_S)
            if res.get("status") not in ("ok", "partial"):
                continue
            # the probe's run lasts longer than WINDOW_S (start, stop, reading): its own duration
            bare_rate = (before + after) / (2 * WINDOW_S)
            lost = during - bare_rate * res["duration_s"]
            runs[f"{kind}_lost"].append(lost * 1000)
            runs[f"{kind}_reported"].append(res["measured_ns"] / 1e6)
            runs[f"{kind}_start"].append(res["start_cpu_s"] * 1000)
            runs[f"{kind}_pause"].append(res["stop_pause_s"] * 1000 if res["stop_pause_s"] is not None else 0)
            runs[f"{kind}_bare"].append(bare_rate * 100)
    finally:
        w.stop()


def _scenario(name: str, main: str, args: list[str], flags: list[str], kind: str, named: str) -> list[str]:
    w = JavaWorkload(main, *args, jvm=flags).start()
    out = Path(f"/tmp/memdiag-bench-jvm-{main}")
    try:
        wait_warmed_up(w.pid)  # as the tests do: past its start-up's compiling
        t0 = time.monotonic()
        subprocess.run([MEMDIAG, "--pid", str(w.pid), "--duration", "30", "--budget", "10", "--output", str(out)],
                       capture_output=True, timeout=240, check=False)  # fmt: skip
        took = time.monotonic() - t0
        rep = json.loads((out / "report.json").read_text())
    finally:
        w.stop()
        subprocess.run(["rm", "-rf", str(out)], check=False)
    v = rep["verdict"]
    ok = "yes" if v["kind"] == kind and named in v["summary"] else "**no**"
    jfr = next((p for p in rep["probes"] if p["name"] == "jfr"), {})
    cost = f"{jfr['overhead_percent']:.2f}%" if jfr.get("overhead_percent") is not None else "not run"
    measured = rep["overhead"]["measured_percent"] or 0
    return [f"| {name} | {v['kind']} | {ok} | {cost} | {measured:.2f}% | {took:.0f} s |"]


def jvm_section(runs_per_figure: int) -> list[str]:
    """Section 8 of BENCHMARKS.md."""
    title = "## 8. JVM targets: the flight recording's cost on the target"
    if not have_jdk():
        return [title, "", "No JDK on this machine (scripts/setup.sh --test installs openjdk-17): not measured.", ""]
    runs: dict[str, list[float]] = {
        f"{k}_{f}": [] for k in ("cold", "warm") for f in ("lost", "reported", "start", "pause", "bare")
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
        "which includes the search of the old objects' paths to GC roots.",
        "",
        "| recording | target's CPU bare | lost (measured here) | reported by the probe | of it, the start "
        "| stop pause |",
        "|---|---|---|---|---|---|",
    ]
    for kind in ("cold", "warm"):
        lines.append(
            f"| {kind} start | {_fmt(runs[f'{kind}_bare'], '{:.1f}')}% of a CPU | {_fmt(runs[f'{kind}_lost'])} ms | "
            f"{_fmt(runs[f'{kind}_reported'])} ms | {_fmt(runs[f'{kind}_start'])} ms | "
            f"{_fmt(runs[f'{kind}_pause'], '{:.1f}')} ms |"
        )
    lines += [
        "",
        "The JVM scenarios of the test suite (tests/e2e/test_jvm.py), 30 s window, `--budget 10` (a cold start, "
        f"{_fmt(runs['cold_start'])} ms of the target's CPU above, is over the default 2% of a 30 s window, 600 ms: "
        "the report says so and gives the counters' verdict):",
        "",
        "| scenario | verdict | right kind, named | recording's cost | measured overhead | wall |",
        "|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        lines += _scenario(*scenario)
    return lines + [""]
