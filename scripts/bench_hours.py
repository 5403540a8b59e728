"""The benchmark's sections that run a whole loop or hours: (6) the alert loop end to end and (7) a
long window's memory and report size (`--only loop`, `--only long`)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_common import BCC_ENV, ROOT, RUNS, MiB, Watch, median_range
from kit import MEMDIAG, Workload

LOOP_TEST = ROOT / "tests" / "e2e" / "test_alert_loop.py"
LOOP_STEPS = (
    ("workload start", "first sample showing growth", "start_to_growth_s"),
    ("first sample showing growth", "alert firing in Prometheus", "growth_to_firing_s"),
    ("alert firing in Prometheus", "incident created by memdiag serve", "firing_to_incident_s"),
    ("incident created", "verdict", "diagnosis_s"),
    ("first sample showing growth", "incident created", "growth_to_incident_s"),
    ("**first sample showing growth**", "**verdict**", "growth_to_verdict_s"),
)


def _version(package: str) -> str:
    done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def _loop_runs() -> tuple[list[dict], list[str]]:
    """RUNS passing runs of the alert loop's test (or RUNS failures): each run's timings, and why each
    failed run failed (on a shared machine another job's swapping wins the verdict)."""
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench-loop-") as tmp:
        out = Path(tmp) / "timings.jsonl"
        out.touch()
        while len(out.read_text().splitlines()) < RUNS and len(failed) < RUNS:
            done = subprocess.run(
                [sys.executable, "-m", "pytest", str(LOOP_TEST), "-q", "-p", "no:cacheprovider", "-k", "leak_goes"],
                env={**os.environ, "MEMDIAG_LOOP_TIMINGS": str(out)},
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                failed.append(
                    next((line[1:].strip() for line in done.stdout.splitlines() if line.startswith("E ")), "?")
                )
                print(f"bench: alert loop run failed: {failed[-1][:300]}", file=sys.stderr)
        runs = [json.loads(line) for line in out.read_text().splitlines()]
    if not runs:
        raise RuntimeError(f"the alert loop failed {len(failed)} times: {failed}")
    return runs, failed


def loop_section() -> list[str]:
    """The alert loop end to end: the CI test itself (tests/e2e/test_alert_loop.py) run RUNS times,
    each run appending its timings (Prometheus's own sample and evaluation timestamps, the
    incident's created and updated times) to a file."""
    from loop import LEAK_KIB_S, SPEED_UP

    measured = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    runs, failed = _loop_runs()
    named = sum("leak_order_history" in r["summary"] for r in runs)
    lines = [
        "## 6. The alert loop: from the first sample of growth to the verdict",
        "",
        f"Measured {measured} (`./scripts/bench.sh loop`: this section alone). The CI test "
        "`tests/e2e/test_alert_loop.py`, run as is: `leak` leaking "
        f"{LEAK_KIB_S // 1024} MiB/s from `leak_order_history()`; Debian's process-exporter "
        f"{_version('prometheus-process-exporter')} naming it `{{{{.Comm}}}}:{{{{.PID}}}}`; Debian's "
        f"Prometheus {_version('prometheus')} scraping and evaluating every second the shipped "
        f"`deploy/prometheus/memdiag-rules.yml` on a clock {SPEED_UP} times faster (every time constant divided by "
        f"{SPEED_UP}, nothing else: MemoryProcessGrowth's 30 min slope is 10 s, its 15 min hold 5 s, its "
        "64 MiB-an-hour floor 64 MiB in 20 s); Alertmanager "
        f"{_version('prometheus-alertmanager')} with the shipped receiver's matchers and grouping, "
        "group_wait 1 s (shipped: 10 s); `memdiag serve --duration 14`. First sample showing growth: the first "
        "scrape whose resident bytes exceed the scrape before (Prometheus's timestamp); firing: the first "
        'evaluation with ALERTS{alertstate="firing"}; incident created and verdict: the incident\'s own times. '
        f"At the shipped speed the growth-to-firing step takes about {SPEED_UP} times longer (here "
        f"{statistics.median(r['growth_to_firing_s'] for r in runs) * SPEED_UP / 60:.0f} min) and the rest of the "
        "loop the same seconds, plus the shipped group_wait's extra 9 s.",
        "",
        "| from | to | latency (median, min–max) |",
        "|---|---|---|",
    ]
    for start, end, key in LOOP_STEPS:
        lines.append(f"| {start} | {end} | {median_range([r[key] for r in runs], '{:.1f}')} s |")
    lines += [
        "",
        f"Verdicts: {', '.join(r['verdict_kind'] for r in runs)}; leaking function named in {named}/{len(runs)}"
        + (
            f"; {len(failed)} more run(s) failed and are not counted: " + "; ".join(f[:200] for f in failed)
            if failed
            else ""
        )
        + ".",
        "",
    ]
    return lines


LONG_TITLE = "## 7. A long window: memdiag's memory and the report's size over hours"


def _rss_over(series: list[tuple[float, int]], seconds: float) -> list[str]:
    """memdiag's RSS (tree) over the window, by tenths: the peak of each, so a growth shows as a climb."""
    if not series:
        return []
    tenth = seconds / 10
    peaks = [max((rss for t, rss in series if i * tenth <= t < (i + 1) * tenth), default=0) for i in range(10)]
    cells = " | ".join(f"{p / MiB:.0f}" if p else "–" for p in peaks)
    return [
        f"memdiag's RSS (process tree), the peak of each tenth of the window ({tenth / 60:.0f} min each), MiB:",
        "",
        "| " + " | ".join(f"{i + 1}/10" for i in range(10)) + " |",
        "|" + "---|" * 10,
        f"| {cells} |",
        "",
    ]


def long_section() -> list[str]:
    """memdiag --pid over a long window (BENCH_LONG, default 6h) on dayshift (a cache filled by day,
    a leak by night, 12 phases): memdiag's peak RSS (tree) and the report folder's size, sampled
    through the window; the cycles, the samples kept and thinned, the verdict."""
    from memdiag.diagnose.options import DURATION

    seconds = DURATION(os.environ.get("BENCH_LONG", "6h"))
    phase = max(10, int(seconds / 12))
    out = Path(tempfile.mkdtemp(prefix="bench-long-"))
    w = Workload("dayshift", str(phase), "16", "100").start()
    sizes: list[int] = []
    try:
        started = time.monotonic()
        proc = subprocess.Popen(
            [MEMDIAG, "--pid", str(w.pid), "--duration", str(seconds), "--output", str(out), "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=BCC_ENV,
            text=True,
        )
        watch = Watch(proc, every_s=max(10.0, seconds / 120))
        while proc.poll() is None:
            sizes.append(sum(f.stat().st_size for f in out.iterdir() if f.is_file()))
            time.sleep(10)
        text = proc.stdout.read()  # type: ignore[union-attr]
        wall = time.monotonic() - started
    finally:
        w.stop()
    rep = json.loads((out / "report.json").read_text())
    final = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    w_ = rep["window"]
    return [
        LONG_TITLE,
        "",
        f"`memdiag --pid` of `dayshift {phase} 16 100` (a 16 MiB cache filled by day, 100 records/s by night",
        f"of which 1 in 7 leaks; {phase} s phases) for `--duration {seconds:.0f}` ({seconds / 3600:.1f} h), once: the",
        "benchmark's other sections do not run it (`./scripts/bench.sh --only long`, `BENCH_LONG=6h`).",
        "",
        "| window | cycles | samples kept | samples thinned | memdiag peak RSS (tree) | report folder, final | "
        "report folder, largest seen | verdict |",
        "|---|---|---|---|---|---|---|---|",
        f"| {wall / 3600:.1f} h | {len(rep['cycles'])} | {w_['samples']} | {w_.get('thinned', 0):,} | "
        f"{watch.peak / MiB:.0f} MiB | {final / 1024:.0f} KiB | {max(sizes or [final]) / 1024:.0f} KiB | "
        f"{rep['verdict']['kind']} ({rep['verdict']['culprit'].get('function')}) |",
        "",
        *_rss_over(watch.series, seconds),
        f"Last line memdiag printed: `{text.strip().splitlines()[0][:160] if text.strip() else ''}`",
        "",
    ]
