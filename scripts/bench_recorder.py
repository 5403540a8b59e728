"""BENCHMARKS.md section 10: what serve's flight recorder costs (diagnose/serve/recorder.py). A real
`memdiag serve` at its defaults (a round every 5 s) watches 10, 100 and 500 memory cgroups, each with
a process in it, and the same server with --no-recorder beside it: its CPU over a measured window
(its own /proc/PID/stat), its RSS at the end, and the recorder's own books (/healthz: its rounds'
CPU, the bytes its series hold). The OOM watch is off in both, so the difference is the recorder's."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from kit import MEMDIAG, MemoryCgroup, Workload

MiB = 1 << 20
SIZES = (10, 100, 500)
WINDOW_S = 60.0
WARM_S = 12.0  # the server up, its first rounds taken (each series allocated at its first sample)
TITLE = "## 10. serve's flight recorder: what watching every cgroup costs"
TICKS = os.sysconf("SC_CLK_TCK")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _health(url: str) -> dict:
    with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
        return json.loads(r.read())


def _serve(recorder: bool) -> dict:
    """One server over the window: its CPU share of one core, RSS, and the recorder's books."""
    port = _port()
    with tempfile.TemporaryDirectory() as data:
        cmd = [MEMDIAG, "serve", "--listen", f"127.0.0.1:{port}", "--data", data, "--no-oom-watch"]
        proc = subprocess.Popen([*cmd, *([] if recorder else ["--no-recorder"])], stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                with contextlib.suppress(OSError):
                    _health(url)
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("memdiag serve did not come up")
                time.sleep(0.3)
            time.sleep(WARM_S)
            h0, c0, t0 = _health(url)["recorder"], _cpu_s(proc.pid), time.monotonic()
            time.sleep(WINDOW_S)
            h1, c1, t1 = _health(url)["recorder"], _cpu_s(proc.pid), time.monotonic()
            out = {"cpu": 100 * (c1 - c0) / (t1 - t0), "rss": _rss(proc.pid)}
            if recorder:
                rounds = h1["rounds"] - h0["rounds"]
                out.update(
                    round_ms=1000 * (h1["cpu_s"] - h0["cpu_s"]) / rounds if rounds else None,
                    series=h1["series_bytes"],
                    cgroups=h1["cgroups_kept"],
                    processes=h1["processes_kept"],
                )
            return out
        finally:
            proc.terminate()
            proc.wait(30)


def _row(n: int) -> str:
    cgs = [MemoryCgroup(64 * MiB, name=f"memdiag-bench-{i:03d}").__enter__() for i in range(n)]
    procs: list[Workload] = []
    try:
        procs = [Workload("idle", cgroup=cg).start() for cg in cgs]
        on, off = _serve(True), _serve(False)
    finally:
        for w in procs:
            w.stop()
        for cg in cgs:
            cg.__exit__()
    return (
        f"| {n} | {on['cgroups']} / {on['processes']} | {on['round_ms']:.1f} ms | {on['cpu']:.2f}% | "
        f"{off['cpu']:.2f}% | "
        f"{on['cpu'] - off['cpu']:.2f}% | {on['rss'] / MiB:.1f} MiB | {off['rss'] / MiB:.1f} MiB | "
        f"{on['series'] / MiB:.1f} MiB |"
    )


def recorder_section() -> list[str]:
    rows = [_row(n) for n in SIZES]
    return [
        TITLE,
        "",
        f"`memdiag serve` at its defaults (a round every 5 s; the OOM watch off in both runs), {WINDOW_S:.0f} s "
        f"measured after {WARM_S:.0f} s of warm-up, with N memory cgroups of 64 MiB made for the run, an idle "
        "process in each, beside the host's own cgroups and processes; the same server with --no-recorder "
        "beside it. CPU: the server's user and system time over the window (its /proc/PID/stat) per second, "
        "as a share of one core; a round: the recorder's own thread CPU per round (/healthz); series: the "
        "bytes its fixed arrays hold once every series exists (a quarter hour at 5 s and the hour a point a "
        "minute, whatever the uptime). One run per row.",
        "",
        "| cgroups made | kept: cgroups / processes | CPU per round | serve's CPU, recorder on | recorder off "
        "| the recorder's share of a core | RSS, recorder on | recorder off | its series |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ]
