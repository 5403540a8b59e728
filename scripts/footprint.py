"""memdiag's own footprint during a diagnosis (issue 26, item 5: at most 60 MiB peak RSS).

Runs the kit's `leak 1024` (glibc; memleak attaches and the reachability scan ends its trace), then
`memdiag --pid N --duration D --quiet` against it, RUNS times (BENCH_RUNS, default 3), and prints
per run and as the median (min-max):
  tree   peak RSS of memdiag and its children summed, sampled every 50 ms (bench_common.Watch's
         measure, at a finer step)
  hwm    memdiag's own VmHWM, last read before it exits (its RSS high-water mark, exact)
  wait4  ru_maxrss from wait4 (the largest of memdiag and any child it reaped, exact)
  anon   memdiag's peak RssAnon (sampled)
and the verdict's kind, so a cut that changes behaviour shows. Run as root:
  .venv/bin/python scripts/footprint.py [--duration 20] [--runs 3]"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "scripts"))
from bench_common import BCC_ENV, MiB, median_range  # noqa: E402
from kit import MEMDIAG, Workload  # noqa: E402


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def one_run(duration: float) -> dict:
    with Workload("leak", "1024") as w:
        out_dir = Path(tempfile.mkdtemp(prefix="footprint-"))
        proc = subprocess.Popen(
            [MEMDIAG, "--pid", str(w.pid), "--duration", str(duration), "--output", str(out_dir), "--quiet"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=BCC_ENV,
        )
        peak = {"tree": 0, "hwm": 0, "anon": 0, "children": 0}
        done = threading.Event()

        def sample() -> None:
            try:
                p = psutil.Process(proc.pid)
            except psutil.Error:
                return
            while not done.is_set():
                try:
                    st = _status(proc.pid)
                    if not st:  # a zombie has no Vm lines
                        break
                    kids = p.children(recursive=True)
                    kid_rss = sum(c.memory_info().rss for c in kids)
                    peak["tree"] = max(peak["tree"], st.get("VmRSS", 0) + kid_rss)
                    peak["hwm"] = max(peak["hwm"], st.get("VmHWM", 0))
                    peak["anon"] = max(peak["anon"], st.get("RssAnon", 0))
                    peak["children"] = max(peak["children"], len(kids))
                except psutil.Error:
                    pass
                time.sleep(0.05)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        output = proc.stdout.read().decode(errors="replace")  # type: ignore[union-attr]
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        done.set()
        sampler.join(2)
    report = out_dir / "report.json"
    kind = json.loads(report.read_text())["verdict"]["kind"] if report.exists() else f"none ({output.strip()!r})"
    return {**peak, "wait4": usage.ru_maxrss * 1024, "kind": kind, "rc": proc.returncode, "out": str(out_dir)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS", "3")))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        r = one_run(args.duration)
        runs.append(r)
        print(
            f"run {i + 1}: tree {r['tree'] / MiB:.1f} MiB, hwm {r['hwm'] / MiB:.1f}, wait4 {r['wait4'] / MiB:.1f}, "
            f"anon {r['anon'] / MiB:.1f}, children {r['children']}, verdict {r['kind']}, rc {r['rc']}, {r['out']}",
            flush=True,
        )
    for key in ("tree", "hwm", "wait4", "anon"):
        print(f"{key}: {median_range([r[key] / MiB for r in runs], '{:.1f} MiB')}")
    print("median tree:", f"{statistics.median(r['tree'] / MiB for r in runs):.1f} MiB")


if __name__ == "__main__":
    main()
