"""What the benchmark's sections share: where the kernel headers are, the figures' format, a tool
run's peak RSS (process tree), CPU time and BPF map memory."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
MiB = 1 << 20
HEADERS = Path("/var/lib/memdiag/kernel-headers") / platform.release()
BCC_ENV = {**os.environ, **({"BCC_KERNEL_SOURCE": str(HEADERS)} if HEADERS.exists() else {})}


def median_range(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "–"
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}–{fmt.format(max(values))})"


class Watch:
    """Peak RSS (process tree) and CPU time of a tool run."""

    def __init__(self, proc: subprocess.Popen, every_s: float | None = None):
        """every_s: also keep (seconds since the start, peak RSS since the last point) that often."""
        self.proc, self.peak, self.map_bytes = proc, 0, 0
        self.every_s, self.series = every_s, []
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        try:
            p = psutil.Process(self.proc.pid)
        except psutil.Error:
            return
        t0 = last = time.monotonic()
        since = 0
        while self.proc.poll() is None:
            try:
                rss = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
                self.peak = max(self.peak, rss)
                since = max(since, rss)
                if self.every_s and time.monotonic() - last >= self.every_s:
                    last = time.monotonic()
                    self.series.append((last - t0, since))
                    since = 0
                self.map_bytes = max(self.map_bytes, bpf_map_bytes(p.pid))
            except psutil.Error:
                pass
            time.sleep(0.1)


def bpf_map_bytes(pid: int) -> int:
    """Kernel memory of the BPF maps a process holds: memlock of each map fd (fdinfo)."""
    total = 0
    fd_dir = Path(f"/proc/{pid}/fdinfo")
    try:
        entries = list(fd_dir.iterdir())
    except OSError:
        return 0
    for entry in entries:
        try:
            text = entry.read_text()
        except OSError:
            continue
        if "map_type:" in text:
            for line in text.splitlines():
                if line.startswith("memlock:"):
                    total += int(line.split()[1])
    return total
