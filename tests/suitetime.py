"""Where the suite's time goes, printed at its end: its wall time, and each file's share of it
(setup, call and teardown of its tests, summed). MEMDIAG_TEST_TIMES=PATH also writes them as JSON
(scripts/test.sh keeps one per run), the figures docs/development.md's table is made from."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

_started = time.monotonic()
_per_test: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report) -> None:
    _per_test[report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _per_test:  # nothing ran (--collect-only, or every test deselected)
        return
    per_file: dict[str, float] = defaultdict(float)
    for nodeid, seconds in _per_test.items():
        per_file[nodeid.split("::", 1)[0]] += seconds
    wall = time.monotonic() - _started
    counted = sum(per_file.values())
    tr = terminalreporter
    tr.section("where the time went")
    for path, seconds in sorted(per_file.items(), key=lambda kv: -kv[1])[:25]:
        tr.write_line(f"{seconds:8.1f} s  {100 * seconds / wall if wall else 0:5.1f}%  {path}")
    tr.write_line(
        f"suite wall time {wall / 60:.1f} min ({wall:.0f} s): {counted:.0f} s in {len(per_file)} files' tests, "
        f"{max(0.0, wall - counted):.0f} s outside them (start-up, collection)"
    )
    path = os.environ.get("MEMDIAG_TEST_TIMES")
    if path:
        with open(path, "w") as f:
            json.dump({"wall_s": wall, "files": per_file, "tests": _per_test}, f, indent=1, sort_keys=True)
