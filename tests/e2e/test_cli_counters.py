"""`memdiag --pid/--cgroup` on real workloads, the short cases: an OOM-killed cgroup, the whole
system, a target that exits, progress on a terminal, and the one-line errors for bad input.
The full scenarios with probes are in test_scenarios.py."""

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from figures import read_report
from kit import MEMDIAG, build, wait_until
from memdiag.diagnose.commands.run import VERDICT_EXIT_CODES

MiB = 1 << 20


def _report(out: Path) -> dict:
    return read_report(out)


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


def test_oom_killed_cgroup_reports_the_kill(memdiag, workload, memcg, tmp_path):
    cg = memcg(64 * MiB, swap=False)
    w = workload("hog", "512", "8", "20", cgroup=cg)
    assert w.wait_exit(30) == -9
    r = memdiag("--cgroup", cg.path, "--duration", "3", "--output", str(tmp_path))
    _ok(r)
    rep = _report(tmp_path)
    v = rep["verdict"]
    assert v["kind"] == "oom"
    assert v["culprit"]["pid"] == w.pid and v["culprit"]["comm"] == "hog"
    assert v["culprit"]["cgroup"] == cg.path
    assert f"PID {w.pid} (hog)" in v["summary"] and "64.0 MiB" in v["summary"]
    assert "while the host has" in v["summary"]
    # the limit killed it, not host memory: the playbook's own finding says so
    assert any(f["id"] == "oom-at-limit-not-host" for f in rep["findings"]), rep["findings"]
    kills = rep["counters"]["oom_kills"]
    assert [k["victim_pid"] for k in kills] == [w.pid]
    assert kills[0]["constraint"] == "CONSTRAINT_MEMCG"
    assert any(f["id"] == "cgroup-oom-count" and f["evidence"]["oom_kill"] == 1 for f in rep["findings"])


def test_a_pid_killed_at_its_cgroups_limit_has_the_kernels_counts_in_the_table(memdiag, workload, memcg, tmp_path):
    """The pid target dies of its cgroup's OOM kill mid-window: the sampling stops with it, and the
    cgroup is read once more, so the table's oom_kill and limit hits are the kernel's own (they
    read 0 from the last sample, taken before the kill) and the verdict agrees with them."""
    cg = memcg(64 * MiB, swap=False)
    w = workload("hog", "512", "4", "250", cgroup=cg)  # 16 MiB/s: killed some 4 s in
    r = memdiag("--pid", str(w.pid), "--duration", "20", "--output", str(tmp_path))
    _ok(r)
    assert w.wait_exit(5) == -9
    rep = _report(tmp_path)
    rows = {(r["scope"], r["name"]): r for r in rep["counters"]["rows"]}
    kernel_kills = cg.oom_kills()
    assert kernel_kills == 1
    assert rows[("cgroup", "oom_kill")]["last"] == kernel_kills
    assert rows[("cgroup", "oom_kill")]["last"] - rows[("cgroup", "oom_kill")]["first"] == 1
    hits = cg.limit_hits()
    assert hits > 0 and rows[("cgroup", "failcnt")]["last"] == hits
    v = rep["verdict"]
    assert v["kind"] == "oom", v["summary"]
    assert v["culprit"]["pid"] == w.pid


def test_oom_loop_in_a_cgroup_counts_kills_by_the_kernel_counter(memdiag, memcg, tmp_path):
    """A worker restarted as fast as the limit kills it: the kill count is the cgroup's counter
    over the window, the kernel log's records are the examples, and the usage is no plateau."""
    cg = memcg(32 * MiB, swap=False)
    hog = build("hog")
    loop = subprocess.Popen(
        ["sh", "-c", f"echo ready; while :; do {hog} 64 8 60 >/dev/null; done"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the shell's "Killed" after every kill
        preexec_fn=lambda: cg.procs_file.write_text(str(os.getpid())),
    )
    try:
        assert loop.stdout.readline() == b"ready\n"
        wait_until(lambda: cg.oom_kills() >= 1, "the first OOM kill in the loop's cgroup")
        _ok(memdiag("--cgroup", cg.path, "--duration", "8", "--output", str(tmp_path)))
    finally:
        loop.kill()
        loop.wait()
        for pid in cg.pids():  # the hog of the moment, before it is killed at its limit once more
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(2)  # the last kill out of the next test's window (a system target counts from 1 s before it)
    rep = _report(tmp_path)  # every figure checked against the tables
    v = rep["verdict"]
    assert v["kind"] == "oom", v["summary"]
    rows = {(r["scope"], r["name"]): r for r in rep["counters"]["rows"]}
    kills = rows[("cgroup", "oom_kill")]["last"] - rows[("cgroup", "oom_kill")]["first"]
    assert kills >= 3
    assert f"{kills:.0f} kills in the window (the cgroup's oom_kill counter)" in v["summary"], v["summary"]
    assert f"the kernel log holds {len(rep['counters']['oom_kills'])}" in v["summary"]
    assert not [f for f in rep["findings"] if "levelled" in f["summary"]]


def test_system_target(memdiag, workload, tmp_path):
    workload("leak", "4096")
    r = memdiag("--system", "--duration", "4", "--output", str(tmp_path))
    _ok(r)
    rep = _report(tmp_path)
    assert rep["target"]["kind"] == "system" and rep["target"]["description"] == "the whole system"
    assert rep["verdict"]["kind"] in {"growth", "healthy", "pressure"}
    assert any(row["name"] == "mem_available" for row in rep["counters"]["rows"])


def test_pid_that_exits_normally_during_the_window(workload, tmp_path):
    w = workload("churn", "1000")
    proc = subprocess.Popen(
        [MEMDIAG, "--pid", str(w.pid), "--duration", "20", "--output", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    w.stop()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    rep = _report(tmp_path)
    assert rep["window"]["target_exited_at"] is not None
    assert rep["verdict"]["kind"] == "inconclusive"
    assert "exited" in rep["verdict"]["summary"]


@pytest.mark.parametrize(
    "args, code, message",
    [
        (["--pid", "4194304"], 2, "--pid 4194304: no such process"),  # pids are below pid_max, at most this
        (["--pid", "-4"], 2, "argument -p/--pid: '-4' is not a whole number at least 1"),
        (["--pid", "2"], 2, "kernel thread"),
        (["--cgroup", "/no/such/cgroup"], 2, "is not a memory cgroup"),
        (["--cgroup", "/etc"], 2, "is not a memory cgroup"),
        (["--duration", "0"], 2, "--duration: '0' is not a finite number more than 0 and at most 86400 seconds"),
        (["--duration", "nan"], 2, "argument -d/--duration: 'nan' is not a finite number"),
        (["--duration", "inf"], 2, "argument -d/--duration: 'inf' is not a finite number"),
        (["--duration", "-1"], 2, "argument -d/--duration: '-1' is not a finite number more than 0"),
        (["--interval", "1e-9"], 2, "argument --interval: '1e-9' is not a finite number at least 0.01 and at most"),
        (["--interval", "nan"], 2, "argument --interval: 'nan' is not a finite number"),
        (["--budget", "nan"], 2, "argument --budget: 'nan' is not a finite number more than 0 and at most 100"),
        (["--budget", "-5"], 2, "argument --budget: '-5' is not a finite number more than 0 and at most 100"),
        (["--max-pause=-inf"], 2, "argument --max-pause: '-inf' is not a finite number at least 0"),
        (["top", "--interval", "nan"], 2, "argument --interval: 'nan' is not a finite number at least 0.01"),
        (["top", "--lines", "0"], 2, "argument -n/--lines: '0' is not a whole number at least 1"),
        (["probe", "memleak", "--duration", "inf"], 2, "argument -d/--duration: 'inf' is not a finite number"),
        (["probe", "memleak", "--sample-every", "0"], 2, "argument --sample-every: '0' is not a whole number"),
        (["--pid", str(os.getpid()), "--output", "/etc/hostname/memdiag-cannot-write"], 2, "not a folder"),
        (["--pid", str(os.getpid()), "--output", "/proc/memdiag-cannot-write"], 2, "holds kernel objects, not files"),
        (["--pid", "abc"], 2, "argument -p/--pid: 'abc' is not a whole number at least 1"),
        (["--bogus"], 2, "unrecognized arguments"),
        # an option only as written: --budget was once taken for jfr's --budget-ms (10 ms, 0.067%)
        (["probe", "jfr", "--pid", str(os.getpid()), "--budget", "10"], 2, "unrecognized arguments: --budget 10"),
        (["--dur=5"], 2, "unrecognized arguments: --dur=5"),
        # every number has an upper bound, checked before anything runs (the BPF side takes u32/u64)
        (["--duration", "1e300"], 2, "--duration: '1e300' is not a finite number more than 0 and at most 86400"),
        (["--interval", "86401"], 2, "at least 0.01 and at most 86400 seconds"),
        (["--max-pause", "1e12"], 2, "--max-pause: '1e12' is not a finite number at least 0 and at most 86400000"),
        (["--pid", "4194305"], 2, "argument -p/--pid: '4194305' is not a whole number at least 1 and at most 4194304"),
        (["--pid", "9" * 5000], 2, "argument -p/--pid: '9999999999999999999999999999999999999999'... is not a whole"),
        (["top", "--lines", "100001"], 2, "argument -n/--lines: '100001' is not a whole number at least 1 and at most"),
        (["probe", "memleak", "--duration", "1e300"], 2, "'1e300' is not a finite number more than 0 and at most"),
        (["probe", "memleak", "--top", "1e3"], 2, "argument --top: '1e3' is not a whole number"),
        (
            ["probe", "memleak", "--sample-every", "99999999999999999999"],
            2,
            "argument --sample-every: '99999999999999999999' is not a whole number at least 1 and at most 4294967295",
        ),
        (
            ["probe", "memleak", "--min-size", "99999999999999999999999"],
            2,
            "argument --min-size: '99999999999999999999999' is not a size of at most 144115188075855872 bytes",
        ),
        (["probe", "memleak", "--max-size", "1e18"], 2, "argument --max-size: '1e18' is not a size of at most"),
        (["probe", "memleak", "--snoop", "1e30"], 2, "argument --snoop: '1e30' is not a size of at most"),
        (["probe", "memleak", "--snoop", "1e400"], 2, "argument --snoop: '1e400' is not a size (examples"),
    ],
)
def test_bad_input_one_line_error(memdiag, root_required, args, code, message):
    r = memdiag(*args, "--quiet")
    assert r.returncode == code
    assert message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_no_permission_without_capabilities(memdiag, root_required, tmp_path):
    # A process of another user, diagnosed by root stripped of its capabilities (as in a container):
    # the kernel refuses /proc/PID/smaps_rollup. (Running memdiag itself as that user would need the
    # checkout to be readable by it, which a CI folder need not be.)
    import shutil

    from kit import build

    shared = Path("/var/tmp") / f"memdiag-perm-{os.getpid()}"
    shared.mkdir(mode=0o755, exist_ok=True)
    binary = shared / "churn"
    shutil.copy(build("churn"), binary)
    binary.chmod(0o755)
    other = subprocess.Popen(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(binary), "1000"], stdout=subprocess.PIPE
    )
    try:
        assert other.stdout.readline().startswith(b"ready")
        r = memdiag("--pid", str(other.pid), "--duration", "1", "--output", str(tmp_path), caps=False)
        assert r.returncode == 1, r.stderr
        assert f"cannot read /proc/{other.pid}/smaps_rollup: permission denied" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    finally:
        other.kill()
        other.wait()
        shutil.rmtree(shared)


def test_progress_on_a_terminal(root_required, workload, tmp_path):
    from kit import MEMDIAG

    w = workload("leak", "2048")
    r = subprocess.run(
        ["script", "-qec", f"{MEMDIAG} --pid {w.pid} --duration 3 --output {tmp_path}", "/dev/null"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TERM": "xterm"},
    )
    assert r.returncode == 0
    assert "sampling counters" in r.stdout and "left" in r.stdout and "RSS" in r.stdout
    assert re.search(r"(leak|growth): .*PID \d+ \(leak\)", r.stdout)


def test_json_on_stdout_is_the_report_and_exit_code_follows_the_verdict(workload, tmp_path):
    """`memdiag -p PID -d 3s -o json --exit-code`: stdout is the report's JSON (what report.json
    holds, the folder still written), the verdict line on stderr, the exit status the verdict's."""
    w = workload("leak", "4096")
    out = tmp_path / "report"
    args = ["-p", str(w.pid), "-d", "3s", "-o", "json", "--exit-code", "--output", str(out)]
    r = subprocess.run([MEMDIAG, *args], capture_output=True, text=True, timeout=120)
    rep = json.loads(r.stdout)
    kind = rep["verdict"]["kind"]
    assert rep["target"]["pid"] == w.pid and rep["window"]["requested_s"] == 3
    assert r.returncode == VERDICT_EXIT_CODES.get(kind, 0), r.stderr
    assert json.loads((out / "report.json").read_text()) == rep
    assert r.stderr.startswith(f"{kind}: ") and f"report: {out / 'report.md'}" in r.stderr


def test_no_folder_writes_nothing_and_the_json_is_the_whole_output(workload, tmp_path):
    w = workload("leak", "4096")
    r = subprocess.run(
        [MEMDIAG, "-p", str(w.pid), "-d", "2", "-o", "json", "--no-folder", "--quiet"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["target"]["pid"] == w.pid and r.stderr == ""
    assert list(tmp_path.iterdir()) == []
