"""memdiag run inside a pid namespace of its own (a container without the host's pids), on a
target started in it too: BPF's own helper gives host pids, which match no pid memdiag reads, so
the programs name processes in memdiag's namespace. A target in a namespace nested below memdiag's
cannot be named there: the probe says so instead of reporting `ok` with nothing seen. OOM kills
are named by the kernel with host pids: oomkill gives the victim's pid in memdiag's namespace, or
says the victim is outside it."""

from __future__ import annotations

import json
import subprocess

from kit import MEMDIAG, build, wait_for_line
from memdiag.diagnose.serve.oomwatch import describe
from memdiag.probes.oomkill import OomEvent
from memdiag.system.kmsg import read_oom_kills

MiB = 1 << 20


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


def _probe_json(stdout: str) -> dict:
    return json.loads(stdout[stdout.index("{") : stdout.rindex("exit=")])


def _hog_in(cg, delay: int) -> str:
    """Shell that starts a hog in cgroup cg after `delay` seconds (time for memdiag to load); $! is its pid."""
    return f"sh -c 'echo $$ > {cg.procs_file}; sleep {delay}; exec {build('hog')} 512 8 20' >/dev/null & "


def test_an_oom_kill_in_memdiags_namespace_is_named_by_its_pid_there(memcg):
    cg = memcg(64 * MiB, swap=False)
    r = in_pid_namespace(
        _hog_in(cg, 6) + f"echo nspid=$!; {MEMDIAG} probe oomkill --pid $! --duration 14 --json; echo exit=$?",
        timeout=90,
    )
    assert "exit=0" in r.stdout, r.stdout + r.stderr
    ns_pid = int(r.stdout.split("nspid=")[1].split()[0])
    result = _probe_json(r.stdout)
    assert result["status"] == "ok", result
    [k] = result["kills"]
    assert k["victim_pid"] == ns_pid and k["trigger_pid"] == ns_pid and k["victim_comm"] == "hog", k
    assert k["outside_namespace"] is None
    # the kernel log names the same kill by its host pid: matched by that number, not the namespace's
    host = k["victim_host_pid"]
    assert host != ns_pid and any(log.victim_pid == host and log.victim_comm == "hog" for log in read_oom_kills())
    assert k["constraint"] == "CONSTRAINT_MEMCG" and k["memcg"] == cg.path
    assert k["victim_cgroup"] == cg.path and k["limit"] == 64 * MiB  # read from /proc/<namespace pid>


def test_an_oom_victim_outside_memdiags_namespace_is_said_to_be_outside(memcg, workload):
    inside, outside = memcg(64 * MiB, swap=False), memcg(48 * MiB, swap=False)
    run = subprocess.Popen(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-c",
            _hog_in(inside, 8) + f"echo nspid=$!; {MEMDIAG} probe oomkill --duration 22 --json; echo exit=$?",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(run, "memdiag probe oomkill: attached")  # memdiag loaded in the namespace
        host_hog = workload("hog", "512", "8", "20", cgroup=outside)
        assert host_hog.wait_exit(30) == -9
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert "exit=0" in out, out + err
    ns_pid = int(out.split("nspid=")[1].split()[0])
    kills = {k["memcg"]: k for k in _probe_json(out)["kills"]}
    k = kills[outside.path]
    assert k["victim_pid"] is None and k["trigger_pid"] is None and k["victim_host_pid"] == host_hog.pid, k
    assert k["outside_namespace"] == (
        f"memdiag runs in a pid namespace of its own: the victim (host PID {host_hog.pid}) is not in it "
        "and the trigger is not in it"
    )
    assert k["victim_cgroup"] == outside.path  # from the kernel log: no /proc/<host pid> was read
    said = describe(OomEvent.model_validate(k))  # serve's incident summary
    assert f"killed host PID {host_hog.pid} (hog)" in said and "triggered by a task outside memdiag's" in said
    k = kills[inside.path]
    assert k["victim_pid"] == ns_pid and k["trigger_pid"] == ns_pid and k["outside_namespace"] is None, k
    assert k["victim_host_pid"] != ns_pid
