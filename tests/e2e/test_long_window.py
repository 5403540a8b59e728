"""A long window watched in cycles, on a business day compressed into seconds (dayshift: a cache
filled by day, a batch job's leak by night): the leak that grows only at night is a leak, named,
cycle after cycle; the cache alone is a cache. The report is rewritten after every cycle, and
draws the window's curve (window.svg)."""

import json
import os
import subprocess
import threading
import time

import pytest
from kit import MEMDIAG, Workload

PHASE = "15"  # seconds of a "day" and of a "night"
WINDOW = ["--duration", "90", "--cycle", PHASE, "--budget", "5"]  # three days and three nights


class _Window:
    """One long window under way: the workload, memdiag running on it, and the first report read
    while the window runs."""

    def __init__(self, out, leak_per_s: str):
        self.out = out
        self.w = Workload("dayshift", PHASE, "16", leak_per_s).start()
        self.seen: list[dict] = []
        try:
            self.proc = subprocess.Popen(
                [MEMDIAG, "--pid", str(self.w.pid), *WINDOW, "--output", str(out), "--quiet"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        except OSError:
            self.w.stop()
            raise
        self.watcher = threading.Thread(target=self._watch, daemon=True)
        self.watcher.start()

    def _watch(self) -> None:  # the report so far, read while the window runs
        while not self.seen and self.proc.poll() is None:
            try:
                self.seen.append(json.loads((self.out / "report.json").read_text()))
            except (OSError, ValueError):
                time.sleep(0.5)

    def report(self) -> dict:
        try:
            _, err = self.proc.communicate(timeout=300)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.w.stop()
        assert self.proc.returncode == 0, err
        self.watcher.join(1)
        assert self.seen and self.seen[0]["interim"].startswith("cycle 1 of 6"), self.seen  # written mid-way
        rep = json.loads((self.out / "report.json").read_text())
        assert rep["interim"] is None and len(rep["cycles"]) == 6, rep["cycles"]
        svg = (self.out / "window.svg").read_text()
        assert svg.startswith("<svg") and "process.rss" in svg
        assert "![memory over the window](window.svg)" in (self.out / "report.md").read_text()
        return rep


@pytest.fixture(scope="module")
def windows(tmp_path_factory):
    """Both 90 s windows at once, each memdiag on its own pid (the tests took 92 s each one after
    the other; the two workloads trace at a few thousand calls a second, well inside --budget 5)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: BPF and /proc of the workloads")
    started: list[_Window] = []
    try:
        for name, leak_per_s in (("night", "2000"), ("cache", "0")):
            started.append(_Window(tmp_path_factory.mktemp(name), leak_per_s))
        return {name: w.report() for name, w in zip(("night", "cache"), started, strict=True)}
    finally:
        for w in started:
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()
            w.w.stop()


def _leaked_in(rep: dict, function: str) -> int:
    return sum(1 for c in rep["cycles"] for s in c["stacks"] if s["function"] == function and s["leaked_count"])


def test_a_leak_that_grows_only_at_night_is_a_leak_beside_a_cache(windows):
    rep = windows["night"]
    v = rep["verdict"]
    assert v["kind"] == "leak" and v["culprit"]["function"] == "night_batch", v
    nights = _leaked_in(rep, "night_batch")
    assert nights >= 2  # cycle after cycle: the nights
    assert _leaked_in(rep, "cache_insert") == 0  # the cache's blocks are held, by night and by day
    assert any(s["function"] == "cache_insert" and s["bytes"] > 0 for c in rep["cycles"] for s in c["stacks"])
    found = next(f for f in rep["findings"] if f["id"] == "leak-in-cycles")
    assert f"night_batch's blocks were leaked (nothing pointed at them) in {nights} of the" in found["summary"]


def test_the_cache_alone_is_a_cache(windows):
    rep = windows["cache"]
    v = rep["verdict"]
    assert v["kind"] == "cache" and v["culprit"]["function"] == "cache_insert", v
    assert not any(f["id"] == "leak-in-cycles" for f in rep["findings"])
