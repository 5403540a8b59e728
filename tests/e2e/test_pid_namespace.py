"""memdiag run inside a pid namespace of its own (a container without the host's pids), on a
target started in it too: BPF's own helper gives host pids, which match no pid memdiag reads, so
the programs name processes in memdiag's namespace. A target in a namespace nested below memdiag's
cannot be named there: the probe says so instead of reporting `ok` with nothing seen."""

from __future__ import annotations

import json
import subprocess

from kit import MEMDIAG, build


def in_pid_namespace(script: str, timeout: float = 180) -> subprocess.CompletedProcess:
    """script run by sh as pid 1 of a new pid namespace with its own /proc (unshare(1))."""
    return subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_memdiag_in_a_pid_namespace_finds_the_leak(root_required, tmp_path):
    leak = build("leak")
    r = in_pid_namespace(
        f"{leak} 2048 >/dev/null & pid=$!; "
        f"{MEMDIAG} --pid $pid --duration 15 --budget 10 --quiet --output {tmp_path}; echo exit=$?; kill $pid"
    )
    assert "exit=0" in r.stdout, r.stdout + r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["target"]["pid"] < 10  # a pid of the namespace, not the host's
    ml = next(p for p in rep["probes"] if p["name"] == "memleak")
    assert ml["status"] == "ok" and ml["events"] > 1000, ml
    v = rep["verdict"]
    assert v["kind"] == "leak" and v["culprit"]["function"] == "leak_order_history", v


def test_a_target_nested_below_memdiags_namespace_is_not_reported_as_seen(root_required):
    leak = build("leak")
    r = in_pid_namespace(
        # the target is pid 1 of a namespace inside memdiag's: memdiag's /proc shows it, BPF cannot name it
        f"unshare --pid --fork {leak} 2048 >/dev/null & "
        f"while ! pid=$(pgrep -x leak); do sleep 0.05; done; "
        f"{MEMDIAG} probe memleak --pid $pid --duration 2 --json; echo exit=$?; kill $!",
        timeout=60,
    )
    assert "exit=0" in r.stdout, r.stdout + r.stderr
    result = json.loads(r.stdout[: r.stdout.rindex("exit=")])
    assert result["status"] == "unavailable", result
    assert "runs in a pid namespace nested below memdiag's" in result["reason"]
    assert "tracing cannot see the target" in result["reason"]
    assert result["cost"]["events"] == 0
