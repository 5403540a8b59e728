"""A long window watched in cycles, on a business day compressed into seconds (dayshift: a cache
filled by day, a batch job's leak by night): the leak that grows only at night is a leak, named,
cycle after cycle; the cache alone is a cache. The report is rewritten after every cycle, and
draws the window's curve (window.svg)."""

import json
import subprocess
import threading
import time

from kit import MEMDIAG

PHASE = "15"  # seconds of a "day" and of a "night"
WINDOW = ["--duration", "90", "--cycle", PHASE, "--budget", "5"]  # three days and three nights


def _diagnose(workload, tmp_path, leak_per_s: str) -> dict:
    w = workload("dayshift", PHASE, "16", leak_per_s)
    seen: list[dict] = []

    def watch() -> None:  # the report so far, read while the window runs
        while len(seen) < 1:
            try:
                seen.append(json.loads((tmp_path / "report.json").read_text()))
            except (OSError, ValueError):
                time.sleep(0.5)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    r = subprocess.run(
        [MEMDIAG, "--pid", str(w.pid), *WINDOW, "--output", str(tmp_path), "--quiet"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    t.join(1)
    assert seen and seen[0]["interim"].startswith("cycle 1 of 6"), seen  # written mid-way
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["interim"] is None and len(rep["cycles"]) == 6, rep["cycles"]
    svg = (tmp_path / "window.svg").read_text()
    assert svg.startswith("<svg") and "process.rss" in svg
    assert "![memory over the window](window.svg)" in (tmp_path / "report.md").read_text()
    return rep


def _leaked_in(rep: dict, function: str) -> int:
    return sum(1 for c in rep["cycles"] for s in c["stacks"] if s["function"] == function and s["leaked_count"])


def test_a_leak_that_grows_only_at_night_is_a_leak_beside_a_cache(workload, tmp_path):
    rep = _diagnose(workload, tmp_path, "2000")
    v = rep["verdict"]
    assert v["kind"] == "leak" and v["culprit"]["function"] == "night_batch", v
    nights = _leaked_in(rep, "night_batch")
    assert nights >= 2  # cycle after cycle: the nights
    assert _leaked_in(rep, "cache_insert") == 0  # the cache's blocks are held, by night and by day
    assert any(s["function"] == "cache_insert" and s["bytes"] > 0 for c in rep["cycles"] for s in c["stacks"])
    found = next(f for f in rep["findings"] if f["id"] == "leak-in-cycles")
    assert f"night_batch's blocks were leaked (nothing pointed at them) in {nights} of the" in found["summary"]


def test_the_cache_alone_is_a_cache(workload, tmp_path):
    rep = _diagnose(workload, tmp_path, "0")
    v = rep["verdict"]
    assert v["kind"] == "cache" and v["culprit"]["function"] == "cache_insert", v
    assert not any(f["id"] == "leak-in-cycles" for f in rep["findings"])
