"""The second-kernel lane's wiring, on the host: its tests (tests/vm) are neither collected nor skipped
by the host's run, and are collected where the lane's guest says it is one (MEMDIAG_LANE_GUEST=1); the
scripts parse."""

import os
import subprocess
from pathlib import Path

from suiteparts import collected

ROOT = Path(__file__).resolve().parents[2]


def test_the_hosts_run_leaves_the_lanes_tests_out_and_the_guest_takes_them():
    env = {k: v for k, v in os.environ.items() if k != "MEMDIAG_LANE_GUEST"}
    host = collected("tests", env=env)  # as the host runs it: every folder
    assert host and not [t for t in host if t.startswith("tests/vm/")]
    guest = collected("tests/vm", env=env | {"MEMDIAG_LANE_GUEST": "1"})
    lane = [t for t in guest if t.startswith("tests/vm/")]
    assert len(lane) >= 8, lane


def test_the_lanes_scripts_parse():
    for script in ("scripts/vm.sh", "scripts/vm-guest.sh", "scripts/test.sh"):
        r = subprocess.run(["bash", "-n", str(ROOT / script)], capture_output=True, text=True)
        assert r.returncode == 0, (script, r.stderr)
