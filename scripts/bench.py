"""memdiag's benchmark: its cost and accuracy measured side by side with the tools people use today
(BCC's memleak), on this machine, written to BENCHMARKS.md. Run by scripts/bench.sh as root.

Sections: (1) slowdown of an allocation-heavy target at three rates, (2) memdiag's own cost
(time, peak RSS incl. bcc's compiler, BPF map memory, CPU) against bcc memleak (`--only own`), (3) per-event
cost of the probes on this host, (4) accuracy and time to verdict on the end-to-end scenarios,
(5) the reachability scan's pause and speed per GiB of writable memory (`--only reach`: that alone),
(6) the alert loop's latency, exporter -> Prometheus -> Alertmanager -> memdiag serve -> verdict
(`--only loop`, or `./scripts/bench.sh loop`: that alone), (7) a long window (`--only long`: hours, so only alone),
(8) JVM targets: the flight recording's cost on the target and the JVM scenarios' verdicts
(scripts/bench_jvm.py; `--only jvm`), (9) non-heap probes' cost (`--only nonheap`), (10) serve's flight
recorder (`--only recorder`), (11) accuracy on the labelled corpus of bench/accuracy (scripts/bench_accuracy.py;
`--only accuracy [--runs N] [--incident NAME]...`: over an hour at 3 runs, so only alone; a subset or fewer
runs prints its table and leaves BENCHMARKS.md as it is). Section 4's scenarios alone: `--only scenarios`.
Numbers are medians of RUNS runs with min-max. No test asserts any of them."""

from __future__ import annotations

import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from memdiag.system import arch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from accuracy_score import TITLE as ACCURACY_TITLE  # noqa: E402
from bench_accuracy import accuracy_section as corpus_section  # noqa: E402
from bench_anon import anon_section  # noqa: E402
from bench_common import BCC_ENV, RUNS, MiB, Watch, median_range  # noqa: E402
from bench_hours import LONG_TITLE, long_section, loop_section  # noqa: E402
from bench_jvm import jvm_section  # noqa: E402
from bench_nonheap import nonheap_section  # noqa: E402
from bench_recorder import recorder_section  # noqa: E402
from kit import MEMDIAG, BenchAlloc, MemoryCgroup, Workload, build, swapfile  # noqa: E402

RATES = [(10_000, "10 thousand/s"), (100_000, "100 thousand/s"), (0, "unthrottled (over 1 million/s)")]
LEAK_FN = "leak_bench_records"


def run_tool(kind: str, pid: int, seconds: float, env: dict | None = None) -> dict:
    """Run a tool against pid; returns times, its output and resource use."""
    out_dir = Path(tempfile.mkdtemp(prefix="bench-"))
    if kind == "memdiag":
        cmd = [MEMDIAG, "--pid", str(pid), "--output", str(out_dir), "--quiet"]
    else:
        cmd = ["memleak-bpfcc", "-p", str(pid), *(["-s", "100"] if kind == "memleak -s 100" else []), "5"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**BCC_ENV, **(env or {})}, text=True
    )
    watch = Watch(proc)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            lines.append((time.monotonic() - start, line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    if kind == "memdiag":
        proc.wait(timeout=seconds + 60)
    else:
        time.sleep(seconds)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    end = time.monotonic()
    reader.join(5)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = "".join(line for _, line in lines)
    attached = next((t for t, line in lines if "Attaching to pid" in line), None)
    first_report = next((t for t, line in lines if "outstanding allocations" in line), None)
    report = None
    if kind == "memdiag" and (out_dir / "report.json").exists():
        report = json.loads((out_dir / "report.json").read_text())
        probes = [t for t in report["trail"] if t["kind"] in ("probe", "budget")]
        attached = probes[0]["at_s"] if probes else None
        text += json.dumps(report["verdict"]) + " ".join(f for s in report["stacks"] for f in s["frames"])
    return {
        "start": start,
        "end": end,
        "attached": attached,
        "first_report": first_report,
        "text": text,
        "named": LEAK_FN in text,
        "peak_rss": watch.peak,
        "map_bytes": watch.map_bytes,
        "report": report,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "wall_s": end - start,
    }


JEMALLOC = arch.library("libjemalloc.so.2")
ALLOCATORS = [("glibc", None), ("jemalloc", {"LD_PRELOAD": JEMALLOC})]


def _one_slowdown(rate: int, env: dict | None, tool: str) -> dict:
    """One run: bench_alloc untraced for 3 s (its cost per operation), then the tool; the time the
    target lost by its own clock over the tool's run, as a share of that run."""
    b = BenchAlloc(rate, env=env).start()
    try:
        time.sleep(3)
        base = b.ns_per_op(time.monotonic() - 2.5, time.monotonic() - 1.0)
        base_cpu = b.ns_per_op(time.monotonic() - 2.5, time.monotonic() - 1.0, cpu=True)
        if tool == "bare":
            t0 = time.monotonic()
            time.sleep(8)
            r = {"start": t0, "end": time.monotonic(), "named": False, "attached": None}
        else:
            r = run_tool(tool, b.pid, 12)
        time.sleep(1.5)  # the last second's report
        # bcc: from attach to the end; memdiag: its whole window (the budget's unit)
        t0 = r["start"] + (r["attached"] or 0) if tool not in ("bare", "memdiag") else r["start"]
        run_ns = (r["end"] - t0) * 1e9
        r["lost_percent"] = 100 * b.lost_ns(t0, r["end"], base) / run_ns if base else None
        r["lost_cpu_percent"] = 100 * b.lost_ns(t0, r["end"], base_cpu, cpu=True) / run_ns if base_cpu else None
        return r
    finally:
        b.stop()


def _reported(r: dict) -> tuple[float | None, str]:
    """memdiag's own overhead figure and its decision on memleak, from its report.json."""
    rep = r.get("report") or {}
    memleak = next((t["state"] for t in rep.get("trail", []) if t["kind"] == "budget"), "–")
    return (rep.get("overhead") or {}).get("measured_percent"), memleak


def _verdicts(runs: list[dict]) -> str:
    """The verdicts memdiag's reports reached, each with its count: "leak 3/3", "leak 2/3, growth 1/3"."""
    kinds = [((r.get("report") or {}).get("verdict") or {}).get("kind", "none") for r in runs]
    return ", ".join(f"{k} {kinds.count(k)}/{len(kinds)}" for k in sorted(set(kinds)))


def slowdown_section() -> tuple[list[str], dict]:
    results: dict = {}
    rows = []
    for rate, label in RATES:
        for alloc, env in ALLOCATORS:
            tools = ["bare", "memdiag"] + (["memleak", "memleak -s 100"] if alloc == "glibc" else [])
            for tool in tools:
                runs = [_one_slowdown(rate, env, tool) for _ in range(RUNS)]
                if alloc == "glibc" and tool != "bare":
                    results[(tool, rate)] = runs
                lost = [r["lost_percent"] for r in runs if r["lost_percent"] is not None]
                lost_cpu = [r["lost_cpu_percent"] for r in runs if r["lost_cpu_percent"] is not None]
                reported = [_reported(r)[0] for r in runs if tool == "memdiag"]
                decisions = sorted({_reported(r)[1] for r in runs}) if tool == "memdiag" else ["–"]
                named = "–" if tool == "bare" else f"{sum(r['named'] for r in runs)}/{len(runs)}"
                rows.append(
                    f"| {label} | {alloc} | {tool} | {'/'.join(decisions)} | {median_range(lost, '{:.2f}%')} | "
                    f"{median_range(lost_cpu, '{:.2f}%')} | "
                    f"{median_range([x for x in reported if x is not None], '{:.2f}%')} | {named} | "
                    f"{_verdicts(runs) if tool == 'memdiag' else '–'} |"
                )
    lines = [
        "## 1. What tracing costs the target, by the target's own clock",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. "
        "`bench_alloc` mallocs and frees mixed sizes at a set rate and leaks 256 KiB/s from "
        f"`{LEAK_FN}()`; every second it reports the time its allocation batches took per operation and "
        "how many it did, by the wall clock and by its thread's CPU clock. Time lost = for each second, "
        "(its time per operation - untraced) x operations, summed over the tool's run, as a share of that "
        "run: what tracing took from it, whether it is throttled (the time comes out of its idle time) or "
        "flat out (out of its throughput). The wall clock is its throughput and also shows what any other "
        "process (memdiag itself included) took from it on this 2-core machine; the CPU clock counts the "
        "traps (charged to the trapping thread) and not that. memdiag: "
        "its whole 30 s window (the budget's unit, default 2%), beside the overhead its report states "
        "(measured on the target: its probes' hits x trap cost + BPF run time, raised to its CPU time over "
        "its rate before where larger, up to twice); memleak column: memdiag's decision on allocation "
        "tracing. bcc memleak: from its attach to its end. Bare: untraced, the noise floor. Under "
        "jemalloc, malloc+0 is single-stepped (its size is read at once and a return probe keeps it "
        "there; free's probe sits on its first branch, which the kernel emulates), so allocation tracing "
        "is refused at far lower rates; where refused (fallback), page faults name the function that "
        "grows and its own calls are traced, with every free of the process under jemalloc (sites).",
        "",
        "| rate | allocator | tool | memleak | time lost, wall clock (median, min–max) | time lost, CPU clock | "
        "memdiag's reported overhead | leaking function named | memdiag's verdict |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
    ]
    return lines + [""], results


def cost_section(results: dict) -> list[str]:
    lines = [
        "## 2. memdiag's own cost (target at 10 thousand allocations/s)",
        "",
        "| tool | to first probe attached | to verdict / first report | peak RSS (tree) | BPF map memory | "
        "CPU seconds |",
        "|---|---|---|---|---|---|",
    ]
    cold = []
    for _ in range(RUNS):
        b = BenchAlloc(10_000).start()
        try:
            time.sleep(3)
            with tempfile.TemporaryDirectory(prefix="bench-bpf-") as cache:
                # nothing kept from an earlier run: compiled programs, and what was read from machine code
                env = {"MEMDIAG_BPF_CACHE": cache, "MEMDIAG_CODE_FACTS": f"{cache}/code-facts.json"}
                cold.append(run_tool("memdiag", b.pid, 30, env=env))
        finally:
            b.stop()
    results[("memdiag, first run on this kernel", 10_000)] = cold
    for tool in ("memdiag", "memdiag, first run on this kernel", "memleak", "memleak -s 100"):
        runs = results.get((tool, 10_000), [])
        attach = [r["attached"] for r in runs if r["attached"] is not None]
        verdict = [r["wall_s"] if tool.startswith("memdiag") else r["first_report"] for r in runs]
        verdict = [v for v in verdict if v is not None]
        lines.append(
            f"| {tool} | {median_range(attach, '{:.1f} s')} | {median_range(verdict, '{:.1f} s')} | "
            f"{median_range([r['peak_rss'] / MiB for r in runs], '{:.0f} MiB')} | "
            f"{median_range([r['map_bytes'] / MiB for r in runs], '{:.1f} MiB')} | "
            f"{median_range([r['cpu_s'] for r in runs], '{:.1f}')} |"
        )
    peaks, walls, count = [], [], ""
    for _ in range(RUNS):
        with tempfile.TemporaryDirectory(prefix="bench-bpf-") as cache:
            start = time.monotonic()
            proc = subprocess.Popen(
                [MEMDIAG, "prepare"], stdout=subprocess.PIPE, text=True, env={**BCC_ENV, "MEMDIAG_BPF_CACHE": cache}
            )
            watch = Watch(proc)
            out, _ = proc.communicate()
            walls.append(time.monotonic() - start)
            watch.thread.join(1)
            peaks.append(watch.peak / MiB)
            count = out.split(" compiled")[0].rsplit(" ", 1)[-1]
    lines += [
        "",
        "memdiag (warm cache, as after set-up and an earlier diagnosis of the same program): the "
        "diagnosing process loads bytecode compiled earlier and never maps LLVM, and reads the placement "
        "of its probes and its forwarder checks from /var/lib/memdiag/code-facts.json instead of loading "
        "the disassembler (capstone, ~10 MiB). First run on this kernel (empty caches): the programs are "
        "compiled by bcc in a child process while the counters are read, and the tree's peak includes "
        "that compiler. "
        f"Compiling all {count} programs ahead (`memdiag prepare`, which set-up runs): "
        f"{median_range(walls, '{:.0f} s')}, peak RSS {median_range(peaks, '{:.0f} MiB')} (bcc's clang).",
        "",
    ]
    return lines


def own_results() -> dict:
    """Section 2's runs alone (--only own): memdiag and bcc's memleak at 10 thousand allocations/s,
    as section 1 runs them."""
    tools = ("memdiag", "memleak", "memleak -s 100")
    _one_slowdown(10_000, None, "memdiag")  # not counted: the earlier diagnosis of this build (section 1's)
    return {(tool, 10_000): [_one_slowdown(10_000, None, tool) for _ in range(RUNS)] for tool in tools}


def per_event_section() -> list[str]:
    from memdiag.probes import faults
    from memdiag.probes.memleak.costs import host_costs
    from memdiag.system.target import Target

    costs = [host_costs(refresh=True) for _ in range(RUNS)]
    per_fault = []
    for _ in range(RUNS):
        with Workload("leak", "8192") as w:
            r = faults.run(Target.for_pid(w.pid), 3)
        if r.cost.bpf_run_ns and r.cost.events:
            per_fault.append(r.cost.bpf_run_ns / r.cost.events)
    ok = [c for c in costs if c is not None]
    F = "{:.0f}"
    return [
        "## 3. Per-event cost on this host",
        "",
        "Measured by calling malloc/free in a loop without and with probes (memdiag's calibration, "
        "the figures its budget uses): the traps with a program that only counts, then memleak's own "
        "programs' run time per hit (BPF statistics); the page-fault program by its BPF run time per event.",
        "",
        "| event | ns per event (median, min–max) |",
        "|---|---|",
        f"| uprobe trap, emulated instruction (malloc+0 `push`) | {median_range([c.emulated_ns for c in ok], F)} |",
        f"| return probe's trap (uretprobe on malloc) | {median_range([c.return_ns for c in ok], F)} |",
        f"| uprobe trap, single-stepped instruction (free+0 `test`) | {median_range([c.stepped_ns for c in ok], F)} |",
        *[
            f"| memleak's `{name}` program (BPF run time per hit) | "
            f"{median_range([c.program_ns[name] for c in ok if name in c.program_ns], F)} |"
            for name in ("malloc_enter", "alloc_return", "free_enter")
        ],
        f"| page-fault raw tracepoint program (BPF run time) | {median_range(per_fault, '{:.0f}')} |",
        "",
    ]


SCENARIOS = [
    ("leak", ("leak", "2048"), "leak", "leak_order_history", None),
    ("bounded cache", ("cache", "64", "6"), "cache", "cache_insert", None),
    ("error-branch leak (1 in 7 orders dropped)", ("errleak", "4000", "7"), "leak", "process_order", None),
    # jemalloc: malloc+0 is single-stepped (~9 µs a call): within 2% only at a tenth the rate
    ("same at 400 orders/s, under jemalloc", ("errleak", "400", "7"), "leak", "process_order", "jemalloc"),
    ("registry that only appends (held)", ("registry", "2000"), "growth", "register_entry", None),
    ("leaked linked lists", ("leaklist", "50"), "leak", "new_node", None),
    ("churn, no growth", ("churn", "200000"), "healthy", None, None),
    ("heap growth by brk", ("mapper", "256", "0"), "growth", "grow_heap_with_brk", None),
    ("anonymous mappings, pointers dropped", ("mapper", "0", "512"), "leak", "map_buffers", None),
    # every block leak_session_cache returns is dropped: a leak, told by tracing only its own calls (sites)
    ("hot allocator (>1M calls/s) with a leak", ("hot", "1024"), "leak", "leak_session_cache", None),
    ("OOM kill in a 64 MiB cgroup", ("hog", "512", "4", "300"), "oom", None, "oom"),
    ("swap pressure in a 96 MiB cgroup", ("hog", "256", "8", "10"), "pressure", None, "swap"),
]


def accuracy_section() -> list[str]:
    lines = [
        "## 4. Accuracy and time to verdict (default 30 s window, 2% budget)",
        "",
        "| scenario | seeded | verdict | culprit named | time to verdict | measured overhead |",
        "|---|---|---|---|---|---|",
    ]
    for name, argv, kind, fn, special in SCENARIOS:
        out = Path(tempfile.mkdtemp(prefix="bench-acc-"))
        with _environment(special) as cg:
            env = {"LD_PRELOAD": JEMALLOC} if special == "jemalloc" else None
            w = Workload(*argv, cgroup=cg, env=env).start()
            try:
                if special == "swap":
                    time.sleep(3)
                t0 = time.monotonic()
                subprocess.run(
                    [MEMDIAG, "--pid", str(w.pid), "--output", str(out), "--quiet"], capture_output=True, timeout=120
                )
                took = time.monotonic() - t0
            finally:
                w.stop()
        rep = json.loads((out / "report.json").read_text())
        v = rep["verdict"]
        text = v["summary"] + " ".join(v["culprit"]["stack"])
        culprit = (fn in text) if fn else (str(w.pid) in text)
        over = rep["overhead"]["measured_percent"]
        lines.append(
            f"| {name} | {kind}{f' ({fn})' if fn else ''} | {v['kind']} | {'yes' if culprit else 'no'} | "
            f"{took:.0f} s | {'–' if over is None else f'{over:.2f}%'} |"
        )
    return lines + [""]


REACH_SIZES_MIB = (256, 1024, 2048)


def _probe_child(pid: int, name: str, extra: list[str]) -> tuple[dict, float]:
    """memdiag probe NAME on pid as a child: its JSON result and its peak RSS in MiB (wait4)."""
    proc = subprocess.Popen(
        [MEMDIAG, "probe", name, "--pid", str(pid), "--duration", "4", "--json", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    out = proc.stdout.read()  # type: ignore[union-attr]
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0
    return json.loads(out), usage.ru_maxrss / 1024


def reach_section() -> list[str]:
    """The reachability scan: pause and speed per GiB of writable memory, and what it adds to
    memdiag's footprint (memleak alone against memleak + scan, same target)."""
    lines = [
        "## 5. Reachability scan: pause per GiB of writable memory",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Target: `bigheap MiB` (that much heap "
        "in 64 KiB blocks, then a slow error-branch leak); `memdiag probe reach --duration 4` with no pause limit. "
        "Pause: first thread stopped to last thread resumed (stopping, reading memleak's table, listing the "
        "mappings, the scan). Speed: bytes read and matched per second of the scan itself. Price: what the "
        "budget check estimated before stopping. Peak RSS: memdiag's (wait4), against `memdiag probe memleak` "
        "on the same target.",
        "",
        "| heap | scanned | pause | pause per GiB | scan speed | priced | peak RSS with scan | peak RSS memleak only |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mib in REACH_SIZES_MIB:
        runs: dict[str, list[float]] = {
            k: [] for k in ("scanned", "pause", "per_gib", "speed", "priced", "rss", "base")
        }
        w = Workload("bigheap", str(mib)).start()
        try:
            time.sleep(1)
            for _ in range(RUNS):
                res, rss = _probe_child(w.pid, "reach", ["--max-pause", "100000"])
                scan = res["reach_scan"]
                if scan["status"] != "ran":
                    continue
                gib = scan["scanned_bytes"] / (1 << 30)
                runs["scanned"].append(scan["scanned_bytes"] / MiB)
                runs["pause"].append(scan["paused_ms"])
                runs["per_gib"].append(scan["paused_ms"] / gib)
                runs["speed"].append(scan["speed_bytes_per_s"] / (1 << 30))
                runs["priced"].append(scan["priced_ms"])
                runs["rss"].append(rss)
                runs["base"].append(_probe_child(w.pid, "memleak", [])[1])
        finally:
            w.stop()
        cells = [
            median_range(runs["scanned"], "{:,.0f}") + " MiB",
            median_range(runs["pause"], "{:,.0f}") + " ms",
            median_range(runs["per_gib"], "{:,.0f}") + " ms",
            median_range(runs["speed"], "{:.2f}") + " GiB/s",
            median_range(runs["priced"], "{:,.0f}") + " ms",
            median_range(runs["rss"], "{:.0f}") + " MiB",
            median_range(runs["base"], "{:.0f}") + " MiB",
        ]
        lines.append(f"| {mib:,} MiB | " + " | ".join(cells) + " |")
    return lines + [""]


def _replace_section(text: str, title: str, body: list[str]) -> str:
    """BENCHMARKS.md with one section (from its title to the next ## or the end) rewritten."""
    start = text.find(title)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + "\n".join(body)
    end = text.find("\n## ", start + len(title))
    return text[:start] + "\n".join(body) + ("\n" + text[end + 1 :] if end >= 0 else "")


class _environment:
    def __init__(self, special: str | None):
        self.special, self.stack = special, []

    def __enter__(self):
        if self.special in (None, "jemalloc"):
            return None
        if self.special == "swap":
            self.swap = swapfile(1 << 30)
            self.swap.__enter__()
            self.cg = MemoryCgroup(96 * MiB).__enter__()
        else:
            self.cg = MemoryCgroup(64 * MiB, swap=False).__enter__()
        return self.cg

    def __exit__(self, *exc):
        if self.special in (None, "jemalloc"):
            return
        self.cg.__exit__()
        if self.special == "swap":
            self.swap.__exit__(None, None, None)


def main() -> int:
    if os.geteuid() != 0:
        print("bench: run as root", file=sys.stderr)
        return 1
    build("bench_alloc")
    subprocess.run([MEMDIAG, "prepare", "--quiet"], check=True, env=BCC_ENV)  # what set-up does
    only = {
        "reach": (reach_section, "5"),
        "slowdown": (lambda: slowdown_section()[0], "1"),
        "own": (lambda: cost_section(own_results()), "2"),
        "costs": (per_event_section, "3"),
        "scenarios": (accuracy_section, "4"),
        "loop": (loop_section, "6"),
        "long": (long_section, "7"),
        "jvm": (lambda: jvm_section(RUNS), "8"),
        "nonheap": (lambda: nonheap_section(RUNS), "9"),
        "recorder": (recorder_section, "10"),
        "anon": (lambda: anon_section(RUNS), "12"),
    }
    if sys.argv[1:3] == ["--only", "accuracy"]:  # the labelled corpus: its own options, its own section
        only["accuracy"] = (lambda: corpus_section(sys.argv[3:]), "11")
    if len(sys.argv) >= 3 and sys.argv[1] == "--only" and sys.argv[2] in only:  # one section, not twenty minutes
        make, number = only[sys.argv[2]]
        path = ROOT / "BENCHMARKS.md"
        body = make()
        if body is None:  # a partial corpus run: printed, BENCHMARKS.md left as it is
            return 0
        text = path.read_text()
        if not text.count(body[0]):  # a section renamed: replace the old one of the same number
            old = next((line for line in text.splitlines() if line.startswith(f"## {number}. ")), None)
            text = text.replace(old, body[0]) if old else text
        path.write_text(_replace_section(text, body[0], body))
        print(f"bench: rewrote section {number} of {path}")
        return 0
    started = time.time()
    slow, results = slowdown_section()
    sections = (
        slow + cost_section(results) + per_event_section() + accuracy_section() + reach_section() + loop_section()
    )
    old = (ROOT / "BENCHMARKS.md").read_text() if (ROOT / "BENCHMARKS.md").exists() else ""
    if LONG_TITLE in old:  # hours long: kept from its own run (--only long), not run again here
        at = old.index(LONG_TITLE)
        end = old.find("\n## ", at + len(LONG_TITLE))
        sections += [""] + old[at : end if end >= 0 else len(old)].rstrip("\n").splitlines() + [""]
    sections += jvm_section(RUNS)
    sections += nonheap_section(RUNS)
    sections += recorder_section()
    sections += anon_section(RUNS)
    if ACCURACY_TITLE in old:  # over an hour: kept from its own run (--only accuracy), not run again here
        at = old.index(ACCURACY_TITLE)
        end = old.find("\n## ", at + len(ACCURACY_TITLE))
        sections += [""] + old[at : end if end >= 0 else len(old)].rstrip("\n").splitlines() + [""]
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    head = [
        "# memdiag benchmarks",
        "",
        "Written by `./scripts/bench.sh` as root (scripts/bench.py); do not edit by hand.",
        "",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}",
        f"- Machine: Linux {platform.release()}, {os.cpu_count()} cores ({cpu}), "
        f"{psutil.virtual_memory().total / (1 << 30):.0f} GiB",
        f"- Runs per figure: {RUNS} (median, min–max); benchmark took {(time.time() - started) / 60:.0f} min",
        "",
    ]
    (ROOT / "BENCHMARKS.md").write_text("\n".join(head + sections))
    print(f"bench: wrote {ROOT / 'BENCHMARKS.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
