"""A target is a process, not a number (issue 42, item 2), on the real kernel.

Seen before: the target exited, another process took its pid, and memdiag priced, uprobed, traced,
ptrace-stopped and scanned the newcomer, naming the newcomer's function under the old target's
name; an exec mid-window went unnoticed and the old image's freed blocks were reported as leaked.

PID reuse is made deterministic inside a pid namespace of the test's own (unshare --pid --fork
--mount-proc), where nothing else forks: the victim is killed and reaped, ns_last_pid is set to
the number before its pid, and the next process started gets that pid. An exec comes when the
test says so (tests/workloads/execleak.c execs on SIGUSR1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kit import ROOT, build, wait_until
from memdiag.diagnose.render import render_all
from memdiag.diagnose.target import pid_target
from memdiag.diagnose.workflow import diagnose
from memdiag.probes import base
from memdiag.probes.memleak import run as memleak_run
from memdiag.probes.memleak.meter import CHECK_S
from memdiag.probes.memleak.reach.model import ScanAborted
from memdiag.probes.memleak.reach.stop import stopped
from memdiag.system import identity

TESTS = Path(__file__).resolve().parent.parent
SLEEP = "/bin/sleep"
CHECKS = 2000  # checks timed for the cost of one (a few ms in all)
CHECK_BOUND_US = 200  # far above the ~6 us measured: the bound only catches a check gone expensive


@pytest.fixture(autouse=True)
def _no_held_identities():
    """Each test counts the pidfds it holds from none: a test elsewhere in the same run that
    resolved a target without diagnosing it (pid_target alone) leaves its resolution held."""
    identity.release_all()
    yield


def _sleeper() -> subprocess.Popen:
    """sleep 60, once its exec is complete (Popen returns when the exec closes its descriptors,
    before the kernel has named the process and laid out its new image)."""
    proc = subprocess.Popen([SLEEP, "60"])
    code = lambda: Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[23]  # noqa: E731
    wait_until(lambda: Path(f"/proc/{proc.pid}/comm").read_text().strip() == "sleep" and code() != "0", "sleep")
    return proc


def _tracer(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("TracerPid:")))


def _parent(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in text.splitlines() if line.startswith("PPid:")))


def _in_pid_namespace(script: str, timeout: float = 120) -> dict:
    """script run by memdiag's interpreter as pid 1 of a new pid namespace with its own /proc; the
    JSON it prints last."""
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


# The victim (sleep) is resolved as the target, killed and reaped; the newcomer (the kit's leak,
# leaking from leak_order_history) takes its pid. Then whatever the script's body does.
REUSE = """
import json, os, subprocess, sys, threading, time
sys.path[:0] = [{tests!r}]
from memdiag.diagnose.target import pid_target
from memdiag.system import identity

victim = subprocess.Popen([{sleep!r}, "60"])
while open(f"/proc/{{victim.pid}}/comm").read().strip() != "sleep":  # its exec complete
    time.sleep(0.001)
target = pid_target(victim.pid)
victim.kill()
victim.wait()
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(victim.pid - 1))
newcomer = subprocess.Popen([{leak!r}, "4096"], stdout=subprocess.PIPE)
newcomer.stdout.readline()
assert newcomer.pid == victim.pid, (newcomer.pid, victim.pid)

traced = []
done = threading.Event()

def watch():  # the newcomer's TracerPid, as often as the thread gets to run
    while not done.is_set():
        try:
            status = open(f"/proc/{{newcomer.pid}}/status").read()
        except OSError:
            return
        tracer = next(l.split()[1] for l in status.splitlines() if l.startswith("TracerPid:"))
        if tracer != "0":
            traced.append(int(tracer))
        time.sleep(0.0002)

watcher = threading.Thread(target=watch)
watcher.start()
out = {{"pid": newcomer.pid, "target": target.describe()}}
try:
{body}
finally:
    done.set()
    watcher.join()
    newcomer.kill()
    newcomer.wait()
out["traced"] = traced
print(json.dumps(out))
"""


def _reuse(body: str) -> dict:
    indented = "\n".join("    " + line for line in body.strip().splitlines())
    script = REUSE.format(tests=str(TESTS), sleep=SLEEP, leak=str(build("leak")), body=indented)
    return _in_pid_namespace(script)


# --- the identity itself, on real processes ---------------------------------------------------


def test_a_held_process_is_the_same_until_it_exits_and_then_says_so(root_required):
    proc = _sleeper()
    try:
        target = pid_target(proc.pid)
        assert target.exe_id == (os.stat(SLEEP).st_dev, os.stat(SLEEP).st_ino)
        assert identity.changed(target) is None and target.alive()
        t = time.monotonic()
        for _ in range(CHECKS):
            identity.changed(target)
        per_check_us = (time.monotonic() - t) / CHECKS * 1e6
        print(f"one identity check: {per_check_us:.1f} us")
        assert per_check_us < CHECK_BOUND_US
        proc.kill()
        proc.wait()
        change = identity.changed(target)
        assert change is not None and change.kind == "exited" and change.pid == proc.pid
        assert not target.alive()
        assert f"the target (PID {proc.pid}) exited at" in change.describe()
        with pytest.raises(identity.TargetChanged):
            identity.check(target)
    finally:
        proc.kill()
        proc.wait()
        identity.release(target)
    assert identity.held_count() == 0


def test_an_exec_is_a_change_of_the_target(workload):
    w = workload("execleak", SLEEP, "60")
    target = pid_target(w.pid)
    assert target.alive()
    os.kill(w.pid, signal.SIGUSR1)
    wait_until(lambda: os.readlink(f"/proc/{w.pid}/exe") == SLEEP or not target.alive(), "the exec")
    change = identity.changed(target)
    assert change is not None and change.kind == "execd" and change.exe == os.path.realpath(SLEEP), change
    assert not target.alive()
    assert f"exec'd {os.path.realpath(SLEEP)}" in change.describe()
    identity.release(target)


def test_a_re_exec_of_the_same_program_is_seen_by_its_new_image(workload):
    if Path("/proc/sys/kernel/randomize_va_space").read_text().strip() == "0":
        pytest.skip("ASLR is off: a re-exec of the same file keeps its addresses (said in system/identity.py)")
    execleak = str(build("execleak"))
    w = workload("execleak", execleak, SLEEP, "60")  # it execs itself: the same executable, a new image
    target = pid_target(w.pid)
    image = Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()[25]
    os.kill(w.pid, signal.SIGUSR1)
    wait_until(lambda: Path(f"/proc/{w.pid}/stat").read_text().rsplit(")", 1)[1].split()[25] != image, "the re-exec")
    change = identity.changed(target)
    assert change is not None and change.kind == "execd" and change.exe == execleak, change
    identity.release(target)


def test_a_pid_reused_in_a_namespace_is_another_process(root_required):
    out = _reuse(
        """
change = identity.changed(target)
out["kind"] = change.kind if change else None
out["alive"] = target.alive()
try:
    identity.open_mem(target.pid)
    out["mem"] = "opened"
except identity.TargetChanged as e:
    out["mem"] = e.strerror
out["newcomer_held"] = pid_target(newcomer.pid).start_ticks != target.start_ticks
"""
    )
    assert out["kind"] == "reused" and out["alive"] is False, out
    assert out["mem"].startswith(f"the target (PID {out['pid']}) exited at")
    assert "its pid now belongs to another process" in out["mem"]
    assert out["newcomer_held"] is True  # the newcomer resolved anew is a target of its own


def test_each_resolution_holds_the_pidfd_until_its_own_diagnosis_ends(root_required):
    """Two diagnoses of one process (serve: two incidents) share its pidfd; the first to end does
    not close it under the other, the last does."""
    proc = _sleeper()
    try:
        first, second = pid_target(proc.pid), pid_target(proc.pid)
        assert identity.held_count() == 1
        identity.release(first)
        assert identity.held_count() == 1 and second.alive()
        assert not identity.sleep(second, 0.01)  # its pidfd still polled: alive, the whole wait
        identity.release(second)
        assert identity.held_count() == 0
    finally:
        proc.kill()
        proc.wait()


def test_past_the_bound_the_oldest_pidfd_is_closed_and_its_identity_still_checked(root_required, monkeypatch):
    """serve may resolve targets it never diagnoses: at most MAX_HELD pidfds stay open (here 2 of
    3), the oldest closed first and then checked by its start time alone."""
    monkeypatch.setattr(identity, "MAX_HELD", 2)
    procs = [_sleeper() for _ in range(3)]
    try:
        targets = [pid_target(p.pid) for p in procs]
        assert identity.held_count() == 2
        assert all(t.alive() for t in targets)  # the oldest too, by its start time
        procs[0].kill()
        procs[0].wait()
        change = identity.changed(targets[0])
        assert change is not None and change.kind == "exited", change
        assert not identity.sleep(targets[1], 0.01) and targets[1].alive()
    finally:
        for p in procs:
            p.kill()
            p.wait()
        identity.release_all()
    assert identity.held_count() == 0


def test_serve_does_not_take_a_stored_pid_for_the_process_it_named_once_another_holds_it(root_required):
    """A re-queued incident (serve restarted) names its target by pid: found again only if that pid
    is still the process stored (its start time), not whatever holds the number now."""
    from memdiag.diagnose.serve.store import Incident
    from memdiag.diagnose.serve.worker import _target_again, target_json

    proc = _sleeper()
    try:
        stored = target_json(pid_target(proc.pid))
        assert stored["start_ticks"] is not None
        incident = Incident(id="i1", created=0.0, updated=0.0, source="api", state="queued", target=stored)
        found = _target_again(incident)
        assert found.pid == proc.pid and found.start_ticks == stored["start_ticks"]
        identity.release(found)
        later = Incident(
            id="i2", created=0.0, updated=0.0, source="api", state="queued",
            target={**stored, "start_ticks": stored["start_ticks"] - 1},  # the one stored started earlier
        )  # fmt: skip
        with pytest.raises(LookupError, match=f"PID {proc.pid} is another process now"):
            _target_again(later)
    finally:
        proc.kill()
        proc.wait()
        identity.release_all()
    assert identity.held_count() == 0


# --- what memdiag does with a target that is gone ----------------------------------------------


def test_a_probe_aimed_at_a_reused_pid_never_touches_the_newcomer(root_required):
    """memleak with its reachability scan, aimed at the old target after its pid went to a leaking
    newcomer: nothing attached, nothing stopped (the newcomer's TracerPid stays 0), nothing of the
    newcomer's code named, and the result says the target exited."""
    out = _reuse(
        """
from memdiag.probes.memleak import run
r = run(target, 3, scan_reach=True, reach_allowed_ms=1000)
out["result"] = r.model_dump(mode="json")
"""
    )
    r = out["result"]
    assert out["traced"] == [], f"the newcomer was ptrace-stopped by {out['traced']}"
    assert "leak_order_history" not in json.dumps(r)
    assert r["status"] == "unavailable" and r["stacks"] == [] and r["reach_scan"] is None, r
    assert r["reason"].startswith(f"the target (PID {out['pid']}) exited at"), r["reason"]
    assert "its pid now belongs to another process" in r["reason"] and "nothing was traced" in r["reason"]
    assert r["target_exited_at"] is not None and r["cost"]["events"] == 0


def test_pricing_a_reused_pid_counts_nothing_of_the_newcomer(root_required):
    """memleak's price (a count of allocator calls with uprobes by pid) for the old target: the
    plan says the target exited and attaches nothing; the count itself, asked by pid number (the
    attach's own check, probes/bpfobj.py), refuses every uprobe the newcomer would have got."""
    out = _reuse(
        """
from memdiag.probes.face import Context
from memdiag.probes.memleak.plan import plan
from memdiag.probes.memleak.ratecount import estimate_call_rates
p = plan(target, Context(seconds=5))
out["plan"] = [p.go, p.state, p.reason]
out["count"] = estimate_call_rates(target.pid, functions=("malloc",)) is None
"""
    )
    go, state, reason = out["plan"]
    assert (go, state) == (False, "unknown") and reason.startswith(f"the target (PID {out['pid']}) exited at")
    assert reason.endswith("not priced, nothing attached"), reason
    assert out["count"] is True  # no rate: the newcomer's malloc was never counted


def test_a_diagnosis_of_a_reused_pid_says_the_target_exited_and_names_nothing_of_the_newcomer(root_required):
    out = _reuse(
        """
from memdiag.diagnose.workflow import diagnose
from memdiag.diagnose.render import render_all
report = diagnose(target, 6)
out["md"] = render_all(report)["report.md"]
out["verdict"] = report.verdict.model_dump(mode="json")
out["held"] = identity.held_count()
"""
    )
    md = out["md"]
    assert out["traced"] == [] and "leak_order_history" not in md, md
    assert "- Target exited at" in md and "its pid then belonged to another process, which memdiag left alone" in md
    assert f"PID {out['pid']} (sleep)" in md and "(leak)" not in md  # the newcomer's name is not the target's
    assert out["verdict"]["kind"] == "inconclusive" and "leak" not in out["verdict"]["summary"], out["verdict"]
    assert out["held"] == 0  # the pidfd went with the diagnosis


def test_an_exec_mid_trace_ends_the_probe_and_drops_the_old_images_blocks(workload):
    """memleak traces a leak that then execs sleep: the run ends within a tick of the exec, says
    so, and reports none of the old image's blocks (freed with it) as leaked or outstanding."""
    w = workload("execleak", SLEEP, "60")
    target = pid_target(w.pid)
    exec_after_s = 1.0  # allocations traced first: a run that ignored the exec would have them

    def on_attached(_name: str) -> None:
        threading.Timer(exec_after_s, os.kill, (w.pid, signal.SIGUSR1)).start()

    base.ATTACHED.append(on_attached)
    try:
        r = memleak_run(target, 8, scan_reach=True, reach_allowed_ms=1000)
    finally:
        base.ATTACHED.remove(on_attached)
        identity.release(target)
    said = json.dumps(r.model_dump(mode="json"))
    assert "leak_before_exec" not in said
    assert r.status == "partial" and r.stacks == [] and r.reach_scan is None, r.reason
    assert f"exec'd {os.path.realpath(SLEEP)}" in r.reason and "dropped" in r.reason, r.reason
    assert r.target_execd_at is not None and r.target_exec == os.path.realpath(SLEEP)
    assert r.duration_s < exec_after_s + 2 * CHECK_S, r.duration_s  # caught within a tick of the exec


def test_a_diagnosis_says_the_target_execd_and_reports_no_leak_of_the_old_image(workload):
    w = workload("execleak", SLEEP, "60")
    target = pid_target(w.pid)
    timer = threading.Timer(2.0, os.kill, (w.pid, signal.SIGUSR1))
    timer.start()
    try:
        report = diagnose(target, 8)
    finally:
        timer.cancel()
    md = render_all(report)["report.md"]
    sleep = os.path.realpath(SLEEP)
    assert report.window.target_execd_at is not None and report.window.target_exec == sleep
    assert f"- Target exec'd `{sleep}` at" in md, md
    assert "leak_before_exec" not in md
    v = report.verdict  # the counters before the exec may still tell growth: the program's own, said as such
    assert v.kind != "leak" and (v.culprit is None or v.culprit.function is None), v
    fired = [t for t in report.trail if t.kind == "rule" and t.name == "execd"]
    assert fired and fired[0].state == "fired", report.trail
    if v.rule == "execd":
        assert v.summary.startswith(f"PID {w.pid} (execleak) exec'd {sleep} during the window"), v.summary
    assert report.window.ended - report.window.started < 6  # the window ended with the program
    assert identity.held_count() == 0


def test_a_change_seen_once_the_threads_are_seized_lets_them_all_go(workload):
    """stopped()'s second look (after every thread is seized, before anything is read): a change
    there aborts the scan with the reason and detaches every thread at once."""
    w = workload("leak", "64")
    target = pid_target(w.pid)
    looks = []

    def same() -> None:
        tracer = _tracer(w.pid)  # the stop's holder, a child of memdiag's, once the threads are seized
        looks.append(tracer and _parent(tracer))
        if len(looks) == 2:  # the look after the seize: as if the target had exec'd meanwhile
            raise ScanAborted("the target exec'd another program: the scan stopped and concluded nothing")

    with pytest.raises(ScanAborted, match="exec'd another program"), stopped(w.pid, same=same):
        raise AssertionError("nothing is read once the target changed")
    assert looks == [0, os.getpid()]  # first before any seize, then with the threads held by memdiag's holder
    assert _tracer(w.pid) == 0  # let go
    assert target.alive()
    identity.release(target)
