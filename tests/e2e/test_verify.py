"""`memdiag verify --baseline DIR` on real programs: an error-branch leak diagnosed, then its process
restarted as the unfixed build (still leaking), the fixed build (fixed) and a fixed build with a
leak of its own elsewhere (new growth). Each restart has a new pid and, rebuilt, a new path: the
service is found again by what the baseline recorded. The exit status is the verification's."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from kit import MEMDIAG, Workload

WINDOW = "30"  # the default window: the first look, the price and 12 s of tracing fit on a busy host
# the budget tracing must fit: these tests check the comparison, not the budget's decision
BUDGET = ["--budget", "5"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([MEMDIAG, *args], capture_output=True, text=True, timeout=240)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    """The unfixed service diagnosed once: a leak in process_order; then the service stops."""
    if os.geteuid() != 0:
        pytest.skip("needs root: BPF and /proc of the workloads")
    out = tmp_path_factory.mktemp("baseline")
    w = Workload("errleak", "2000").start()
    try:
        r = _run("--pid", str(w.pid), "--duration", WINDOW, "--output", str(out), "--quiet", *BUDGET)
    finally:
        w.stop()
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["verdict"]["kind"] == "leak" and rep["verdict"]["culprit"]["function"] == "process_order", rep["verdict"]
    return out, w.pid


def _verify(baseline: Path, out: Path, *flags: str) -> tuple[subprocess.CompletedProcess, dict]:
    w = Workload("errleak", "2000", flags=list(flags)).start()
    try:
        r = _run("verify", "--baseline", str(baseline), "--output", str(out), "--quiet", *BUDGET)
    finally:
        w.stop()
    assert "Traceback" not in r.stderr, r.stderr
    v = json.loads((out / "report.json").read_text())["verification"]
    assert v["found_by"].endswith(f"PID {w.pid}"), v["found_by"]  # found again, whatever the pid
    return r, v


def _row(v: dict, function: str) -> dict:
    return next(r for r in v["stacks"] if r["function"] == function)


def test_an_unfixed_restart_is_still_leaking(baseline, tmp_path):
    folder, old_pid = baseline
    r, v = _verify(folder, tmp_path)
    assert r.returncode == 3 and r.stdout.startswith("still-leaking: "), (r.returncode, r.stdout, r.stderr)
    assert v["status"] == "still-leaking" and v["baseline_function"] == "process_order"
    row = _row(v, "process_order")
    assert row["status"] == "still-leaking" and row["before_rate"] > 0
    assert row["after_rate"] is None or row["after_rate"] > 0  # both rates, where tracing ran
    md = (tmp_path / "report.md").read_text()
    assert "## Verification" in md and "`process_order` still" in md


def test_the_fixed_build_restarted_is_fixed(baseline, tmp_path):
    folder, _ = baseline
    r, v = _verify(folder, tmp_path, "-DFIXED")
    assert r.returncode == 0 and r.stdout.startswith("fixed: "), (r.returncode, r.stdout, r.stderr)
    row = _row(v, "process_order")
    assert row["status"] == "fixed" and not row["after_leaked"]
    assert "its executable and arguments" in v["found_by"]  # rebuilt: another path, the same program


def test_a_fix_with_a_leak_elsewhere_is_new_growth(baseline, tmp_path):
    folder, _ = baseline
    r, v = _verify(folder, tmp_path, "-DFIXED", "-DAUDIT_LEAK")
    assert r.returncode == 4 and r.stdout.startswith("new-growth: "), (r.returncode, r.stdout, r.stderr)
    assert _row(v, "process_order")["status"] == "fixed"
    assert _row(v, "audit_failure")["status"] == "new-growth"


def test_bad_baselines_are_one_line_each(root_required, tmp_path):
    missing = _run("verify", "--baseline", str(tmp_path / "nowhere"))
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "report.json").write_text('{"memdiag_version": "0", "target": 5}')
    junk = _run("verify", "--baseline", str(tmp_path / "junk"))
    for r, said in ((missing, "no report.json there"), (junk, "is not a report of this memdiag version")):
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and said in lines[0], (r.returncode, r.stderr)


def test_a_service_that_runs_no_more_is_one_line(baseline, tmp_path):
    folder, _ = baseline
    r = _run("verify", "--baseline", str(folder), "--output", str(tmp_path / "out"))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "no process runs as" in lines[0], r.stderr
    assert not (tmp_path / "out").exists()
