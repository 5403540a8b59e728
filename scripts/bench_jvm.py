"""BENCHMARKS.md section 8: JVM targets. What the JVM's flight recording costs the target, measured on
the target in windows without memdiag before and after each recording (interleaved, so the target's
own drift shows), two ways side by side: what the application paid (its own threads' wait for a CPU,
/proc/PID/task/TID/schedstat, and the CPU time they lost, both against their rates bare; the JVM's
safepoint time above its rate, from its counters) and what the whole JVM spent (its CPU time, utime +
stime, above its rate bare); on a JVM that leaves cores idle and on one that keeps every CPU busy;
against what the probe reported. Then the class histograms' cost, and the verdicts of the JVM
scenarios of the test suite at memdiag's defaults. Imported by scripts/bench.py."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from pathlib import Path

from jvmkit import JavaWorkload, have_jdk, wait_warmed_up
from kit import MEMDIAG
from memdiag.probes.jvm.meter import JVM_OWN
from memdiag.system.hsperfdata import read_perfdata
from memdiag.system.jvm import jvm_counters
from memdiag.system.process import cpu_seconds

WINDOW_S = 10  # each window: bare, recorded, bare
CPUS = len(os.sched_getaffinity(0))
TARGETS = (  # (label, main, args, flags): the seed's order service, ~2 MiB/s retained
    ("cores idle", "OrderService", ["1000"], ["-Xmx512m"]),
    ("every CPU busy", "OrderService", ["1000", "8", str(CPUS)], ["-Xmx512m"]),
)
SCENARIOS = (  # (name, main, args, flags, verdict kind, named in it, --budget; None: memdiag's defaults)
    ("static retry list", "OrderService", ["1000"], ["-Xmx512m"], "growth", "OrderService.retryQueue", None),
    ("bounded LRU cache", "LruCache", ["1000", "4000"], ["-Xmx1g"], "cache", "LruCache.cache", None),
    ("static retry list, every CPU busy", "OrderService", ["1000", "8", str(CPUS)], ["-Xmx512m"], "growth",
     "byte[]", None),
    ("bounded LRU cache, every CPU busy", "LruCache", ["1000", "4000", str(CPUS)], ["-Xmx1g"], "cache", "", None),
    ("heap near -Xmx", "HeapThrash", [], ["-Xmx128m"], "pressure", "pressure inside the Java heap", "10"),
    ("JNI native leak", "NativeLeak", ["2000"], ["-Xmx256m"], "leak", "stash_record", "10"),
)  # fmt: skip
JVM_PROBES = ("jfr", "histogram")


def _fmt(values: list[float], fmt: str = "{:.0f}") -> str:
    if not values:
        return "–"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


_TCK = os.sysconf("SC_CLK_TCK")


def _sample(pid: int) -> dict[str, float]:
    """The JVM's counters now: its CPU, its application threads' CPU and run-queue wait, its safepoints."""
    app_cpu = app_wait = 0.0
    base = Path(f"/proc/{pid}/task")
    for t in base.iterdir():
        try:
            stat = (t / "stat").read_text()
            wait = int((t / "schedstat").read_text().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
        name = stat[stat.find("(") + 1 : stat.rfind(")")]
        if name.startswith(JVM_OWN):
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        app_cpu += (int(rest[11]) + int(rest[12])) / _TCK
        app_wait += wait
    perf = read_perfdata(pid)
    pause = jvm_counters(perf).safepoint_time_s if perf is not None else None
    return dict(t=time.monotonic(), cpu=cpu_seconds(pid) or 0.0, app_cpu=app_cpu, app_wait=app_wait, pause=pause or 0.0)


def _rates(a: dict, b: dict) -> dict[str, float]:
    return {k: (b[k] - a[k]) / (b["t"] - a["t"]) for k in a if k != "t"}


def _bare(pid: int) -> dict[str, float]:
    a = _sample(pid)
    time.sleep(WINDOW_S)
    return _rates(a, _sample(pid))


# the class histograms run alone get the default 2% of their own run: 30 s pays for two looks at OrderService
HISTOGRAM_S = 30
KINDS = ("cold", "warm")


def _probed(pid: int, kind: str) -> tuple[dict, dict, dict]:
    """`memdiag probe jfr` for WINDOW_S (or histogram for HISTOGRAM_S) on pid: its JSON result, and the
    target's counters before and after its whole run."""
    how = ["histogram", "--duration", str(HISTOGRAM_S)] if kind == "histogram" else [
        "jfr", "--duration", str(WINDOW_S), "--budget-ms", "60000"]  # fmt: skip
    a = _sample(pid)
    done = subprocess.run(
        [MEMDIAG, "probe", how[0], "--pid", str(pid), *how[1:], "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    return json.loads(done.stdout), a, _sample(pid)


def _one_jvm(label: str, main: str, args: list[str], flags: list[str], runs: dict[str, list[float]]) -> None:
    """A fresh JVM: bare, a cold recording, bare, a warm recording, bare (then, where its cores are
    idle, two class histograms and bare)."""
    w = JavaWorkload(main, *args, jvm=flags).start()
    try:
        wait_warmed_up(w.pid)  # past its start-up: the JIT's first compilations
        kinds = (*KINDS, "histogram") if label == TARGETS[0][0] else KINDS
        before = _bare(w.pid)
        for kind in kinds:
            res, a, b = _probed(w.pid, kind)
            after = _bare(w.pid)
            if res.get("status") not in ("ok", "partial"):
                continue
            bare = {k: (before[k] + after[k]) / 2 for k in before}
            took = b["t"] - a["t"]

            def above(k: str) -> float:  # ms above the bare rate over the probe's whole run
                return 1000 * (b[k] - a[k] - bare[k] * took)  # noqa: B023

            figures = {
                "jvm_cpu": above("cpu"),
                "app_wait": above("app_wait"),
                "app_cpu_lost": -above("app_cpu"),
                "pause": above("pause"),
                "reported": res["measured_ns"] / 1e6,
                "bare": bare["cpu"] * 100,
            }
            if res.get("threads_ns") is not None and kind != "histogram":
                figures["threads"] = res["threads_ns"] / 1e6
            if res.get("read_cpu_s") is not None:
                figures["read"] = res["read_cpu_s"] * 1000
            for name, value in figures.items():
                runs.setdefault(f"{label}/{kind}/{name}", []).append(value)
            before = after
    finally:
        w.stop()


def _scenario(
    name: str, main: str, args: list[str], flags: list[str], kind: str, named: str, budget: str | None
) -> list[str]:
    w = JavaWorkload(main, *args, jvm=flags).start()
    out = Path(f"/tmp/memdiag-bench-jvm-{main}")
    options = ["--duration", "30", "--budget", budget] if budget else []
    try:
        wait_warmed_up(w.pid)  # as the tests do: past its start-up's compiling
        t0 = time.monotonic()
        subprocess.run([MEMDIAG, "--pid", str(w.pid), *options, "--output", str(out)],
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
    beside = {n: cpu for n, _what, _paid, cpu in rep["overhead"].get("measured_otherwise", [])}
    cpu = f"{beside['jfr']:.2f}%" if beside.get("jfr") is not None else "–"
    measured = rep["overhead"]["measured_percent"] or 0
    shown = f"{budget}%" if budget else "defaults (2%)"
    return [f"| {name} | {shown} | {v['kind']} | {ok} | {cost} | {cpu} | {measured:.2f}% | {took:.0f} s |"]


def jvm_section(runs_per_figure: int) -> list[str]:
    """Section 8 of BENCHMARKS.md."""
    title = "## 8. JVM targets: what the flight recording and the class histograms cost the target"
    if not have_jdk():
        return [title, "", "No JDK on this machine (scripts/setup.sh --test installs openjdk-17): not measured.", ""]
    runs: dict[str, list[float]] = {}
    for _ in range(runs_per_figure):
        for target in TARGETS:
            _one_jvm(*target, runs)
    lines = [
        title,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {CPUS} CPUs. Target: the kit's "
        "`OrderService 1000` (`-Xmx512m`, 1,000 batches/s, ~2 MiB/s retained), a fresh JVM per run, with its cores "
        f"idle (the service uses about 1% of a CPU) and with every CPU busy ({CPUS} threads of the kit's Pricers "
        f"beside it); `memdiag probe jfr --duration {WINDOW_S}` (run alone it first watches the target for a "
        "second: its rates before), first in a JVM where JFR never ran (cold: JFR JIT-compiles its own code), "
        f"then again (warm). Each figure is above the target's rate in the {WINDOW_S} s windows without memdiag "
        "just before and just after the probe's whole run (memdiag's own start and its reading of the "
        "recording included). **The application**: its own threads (every thread not the JVM's compiler, GC, "
        "VM, JFR, attach, signal or reference threads, by name): their wait for a CPU (schedstat's run-queue "
        "delay) and the CPU time they lost (for threads that compute flat out, their throughput), and the "
        "JVM's safepoint time (its counters: the application stopped). **The whole JVM**: its CPU time (utime "
        "+ stime). Reported: what the probe measured and enforces, what the application paid (its threads' "
        "wait above their rate and the safepoints of memdiag's commands); "
        "beside it in the report, the CPU time of the JVM's threads doing the recording's work, and memdiag's own "
        "CPU reading the recording with its jfr tool (a JVM of its own, after the stop). Where every CPU is "
        "busy, the application also waits for memdiag's own work (its start, its second of rates before, its "
        "jfr tool): the application's figures here include that, what the probe reports does not (a warm "
        "start's row is mostly that).",
        "",
        "| target | JFR start | whole JVM: CPU above its rate | its recording threads' CPU (reported beside) "
        "| application: wait for a CPU | application: CPU lost | safepoints | reported: what the application paid "
        "| memdiag's jfr tool's CPU (reported beside) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, *_ in TARGETS:
        for kind in KINDS:
            k = f"{label}/{kind}"
            lines.append(
                f"| {label} | {kind} | {_fmt(runs.get(f'{k}/jvm_cpu', []))} ms | "
                f"{_fmt(runs.get(f'{k}/threads', []))} ms | {_fmt(runs.get(f'{k}/app_wait', []))} ms | "
                f"{_fmt(runs.get(f'{k}/app_cpu_lost', []))} ms | {_fmt(runs.get(f'{k}/pause', []), '{:.1f}')} ms | "
                f"{_fmt(runs.get(f'{k}/reported', []))} ms | {_fmt(runs.get(f'{k}/read', []))} ms |"
            )
    h = f"{TARGETS[0][0]}/histogram"
    lines += [
        "",
        f"Two class histograms (`memdiag probe histogram --duration {HISTOGRAM_S}` on the same JVM, cores idle; "
        "jcmd GC.class_histogram, each a full collection at a safepoint): the whole JVM's CPU above its rate "
        f"{_fmt(runs.get(f'{h}/jvm_cpu', []))} ms, safepoints above their rate "
        f"{_fmt(runs.get(f'{h}/pause', []), '{:.1f}')} ms; reported (the CPU of the JVM's threads doing it, raised "
        f"to the process's) {_fmt(runs.get(f'{h}/reported', []))} ms.",
        "",
        "The JVM scenarios of the test suite (tests/e2e/test_jvm.py), 30 s window, at memdiag's defaults (2%) and "
        "at `--budget 10`. The recording is priced by what the application would pay: the JVM's CPU for it at the "
        "share of the CPUs the JVM kept busy before, and its safepoints; where that is over the budget (a JVM "
        "keeping every CPU busy pays all of JFR's first start) the playbook runs two class histograms in its "
        "place, and the advice gives the command that pays. The JVM probe's cost: what it measured on the target, "
        "as a share of the window, with the whole JVM's CPU above its rate beside it for a recording (that one "
        "moves with the JVM's own load: HeapThrash's collections lengthen through the window by design):",
        "",
        "| scenario | budget | verdict | right kind, named | JVM probe's cost | whole JVM's CPU, beside | "
        "measured overhead | wall |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        lines += _scenario(*scenario)
    return lines + [""]
