"""What the second-kernel lane's tests share. Emulation makes every trap ~11x dearer than on the
host: windows are long, memleak is given a larger budget where a test needs it (BUDGET), and nothing
here judges a timing."""

from __future__ import annotations

import json
import os
from pathlib import Path

MiB = 1 << 20
# a larger budget where the test needs memleak: under emulation its traps are priced over 2%
BUDGET = os.environ.get("MEMDIAG_LANE_BUDGET", "30")
# the longest pause allowed to the reachability scan where a test needs it (ms): emulation reads the
# target's memory at ~55 MiB/s (sampled on a leak's heap), against the host's GiB/s, so a 55 MiB heap
# was refused at the default 1 s (a container's leak came out "growth", the scan skipped)
MAX_PAUSE_MS = os.environ.get("MEMDIAG_LANE_MAX_PAUSE", "10000")


def diagnose(memdiag, out: Path, *args: str, timeout: float = 900) -> dict:
    """A diagnosis as a user runs it; its report.json, after checking it ran cleanly."""
    r = memdiag(*args, "--output", str(out), timeout=timeout)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return json.loads((out / "report.json").read_text())


def row(rep: dict, scope: str, name: str) -> dict:
    """One row of the report's counter table."""
    rows = [r for r in rep["counters"]["rows"] if r["scope"] == scope and r["name"] == name]
    assert rows, f"no {scope} {name} row in {[(r['scope'], r['name']) for r in rep['counters']['rows']]}"
    return rows[0]


def kv(path: Path) -> dict[str, int]:
    """A kernel file of `key value` lines (memory.events, memory.stat)."""
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def trail(rep: dict, kind: str, name: str) -> list[dict]:
    """The trail's steps of one kind ("budget", "probe", "rule") for one name."""
    return [t for t in rep["trail"] if t["kind"] == kind and t["name"] == name]
