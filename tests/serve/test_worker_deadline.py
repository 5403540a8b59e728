"""serve's worker runs each diagnosis in a process of its own and kills it at its deadline: a
diagnosis blocked for good in the kernel (open() of a FIFO, through the hangseam runner) ends its
incident as failed with the reason, nothing of it is left running, and the next incident, queued
behind it, is diagnosed. The alert delivered again is retried once, then no more."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from fusehang import never_answering
from memdiag.diagnose.serve import worker as worker_module
from memdiag.diagnose.serve.store import Store
from memdiag.diagnose.serve.worker import Worker, target_json
from memdiag.diagnose.target import pid_target
from memdiag.system import identity

DEADLINE_S = 3.0


def _children() -> dict[int, str]:
    """This process's children: pid -> command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid():
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
    return out


def _child_waiting_in(wchan: str) -> int:
    """The one serve diagnosis process (a child of this test's), once the kernel has it waiting in
    wchan: where the hostile target's file holds it."""
    end = time.monotonic() + 30
    while not (kids := [k for k, cmd in _children().items() if "memdiag.diagnose.serve.child" in cmd]):
        assert time.monotonic() < end
        time.sleep(0.05)
    (child,) = kids
    end = time.monotonic() + 30
    while Path(f"/proc/{child}/wchan").read_text() != wchan:
        assert time.monotonic() < end, Path(f"/proc/{child}/wchan").read_text()
        time.sleep(0.05)
    return child


def _settled(store: Store, iid: str, timeout: float):
    end = time.monotonic() + timeout
    while (incident := store.get(iid)).state not in ("done", "failed"):
        assert time.monotonic() < end, incident
        time.sleep(0.1)
    return incident


def test_a_hung_diagnosis_is_killed_at_its_deadline_and_the_next_one_runs(root_required, tmp_path, monkeypatch):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    hostile, next_one = (subprocess.Popen(["sleep", "600"]) for _ in range(2))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    monkeypatch.setenv("MEMDIAG_TEST_HANG_PID", str(hostile.pid))
    monkeypatch.setenv("MEMDIAG_TEST_HANG_FIFO", str(fifo))
    store = Store(tmp_path / "data")
    identity.release_all()  # this test counts the pidfds serve holds, from none
    try:
        worker = Worker(store, 1.0, 1.0, None, deadline=lambda window: DEADLINE_S, runner="hangseam:diagnose_or_hang")
        ids = []
        for p in (hostile, next_one):
            target = pid_target(p.pid)
            incident, _ = store.admit("test", target_json(target), None, f"key-{p.pid}")
            worker.submit(incident.id, target)
            ids.append(incident.id)
        child = _child_waiting_in("wait_for_partner")  # the first diagnosis, blocked in the kernel's FIFO open
        hung = _settled(store, ids[0], 30)
        assert hung.state == "failed", hung
        assert hung.error == f"the diagnosis did not end within its deadline ({DEADLINE_S:g} s); killed", hung.error
        assert DEADLINE_S <= hung.duration_s < DEADLINE_S + 2, hung.duration_s
        assert not Path(f"/proc/{child}").exists()  # killed and reaped
        assert worker.health() is None
        done = _settled(store, ids[1], 90)  # queued behind the hung one, diagnosed
        assert done.state == "done", done
        # what serve held of both targets since they were resolved: let go with their incidents
        end = time.monotonic() + 5
        while identity.held_count():
            assert time.monotonic() < end, f"{identity.held_count()} pidfds still held by serve"
            time.sleep(0.05)
        assert done.verdict_kind == "healthy" and f"PID {next_one.pid} (sleep)" in done.summary, done
        assert not [cmd for cmd in _children().values() if "memdiag.diagnose.serve.child" in cmd]
        assert hung.attempts == 2  # of 3: one retry left
        # the alert delivered again: retried once, killed again, then not retried
        again, how = store.admit("test", target_json(pid_target(hostile.pid)), None, f"key-{hostile.pid}")
        assert (again.id, how) == (ids[0], "requeued")
        worker.submit(again.id, pid_target(hostile.pid))
        hung = _settled(store, ids[0], 30)
        assert hung.state == "failed" and hung.attempts == 3, hung
        assert hung.error == f"the diagnosis did not end within its deadline ({DEADLINE_S:g} s); killed; not retried"
        assert hung.previous.startswith("attempt 2 failed: the diagnosis did not end within its deadline")
        _, how = store.admit("test", target_json(pid_target(hostile.pid)), None, f"key-{hostile.pid}")
        assert how == "duplicate"
    finally:
        for p in (hostile, next_one):
            p.kill()
            p.wait()
        store.close()


def test_a_diagnosis_that_sigkill_cannot_end_does_not_hold_the_worker(root_required, tmp_path, monkeypatch):
    """Before: the worker killed the diagnosis at its deadline, then waited for it for good (its
    process in D in fuse_lock_inode, SIGKILL pending): the next incident stayed queued and /healthz
    said stuck until the target's FUSE server let go."""
    hostile, next_one = (subprocess.Popen(["sleep", "600"]) for _ in range(2))
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    store = Store(tmp_path / "data")
    child = None
    try:
        with never_answering(tmp_path / "mnt", hold=True) as mnt:  # killed on the way out: the lookup returns
            monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
            monkeypatch.setenv("MEMDIAG_TEST_HANG_PID", str(hostile.pid))
            monkeypatch.setattr(worker_module, "REAP_S", 1.0)  # the wait for a killed process that cannot die
            monkeypatch.setenv("MEMDIAG_TEST_HANG_PATH", f"{mnt}/x")
            monkeypatch.setenv("MEMDIAG_TEST_HANG_FIFO", str(fifo))
            worker = Worker(
                store, 1.0, 1.0, None, deadline=lambda window: DEADLINE_S, runner="hangseam:diagnose_or_hang"
            )
            ids = []
            for p in (hostile, next_one):
                incident, _ = store.admit("test", target_json(pid_target(p.pid)), None, f"key-{p.pid}")
                worker.submit(incident.id, pid_target(p.pid))
                ids.append(incident.id)
            child = _child_waiting_in("fuse_lock_inode")
            hung = _settled(store, ids[0], 60)
            assert hung.state == "failed", hung
            said = f"the diagnosis did not end within its deadline ({DEADLINE_S:g} s); killed, but its "
            assert hung.error.startswith(said), hung
            assert f"blocked in the kernel past SIGKILL (PID {child}" in hung.error
            assert DEADLINE_S + 1.0 <= hung.duration_s < DEADLINE_S + 1.0 + 2, hung.duration_s  # one reap wait, not two
            assert Path(f"/proc/{child}/status").read_text().count("D (disk sleep)") == 1  # still there, unkillable
            done = _settled(store, ids[1], 90)  # the next incident is diagnosed all the same
            assert done.state == "done" and f"PID {next_one.pid} (sleep)" in done.summary, done
            assert worker.health() is None
    finally:
        for p in (hostile, next_one):
            p.kill()
            p.wait()
        if child is not None:
            end = time.monotonic() + 10
            while Path(f"/proc/{child}").exists() and time.monotonic() < end:
                time.sleep(0.05)
            assert not Path(f"/proc/{child}").exists()  # reaped by the worker's thread
        store.close()


def test_the_worker_is_called_stuck_only_past_its_kill_and_reap(tmp_path):
    """healthz's 'stuck' comes after the deadline the worker kills at and the reaping after it,
    for short windows too (3x a 5 s window plus 2 minutes came before the kill and reap were done)."""
    from memdiag.diagnose.serve.worker import REAP_S, STUCK_MARGIN_S

    store = Store(tmp_path / "data")
    try:
        worker = Worker(store, 1.0, 1.0, None, deadline=lambda window: 2 * window + 120)
        last_ok = 2 * 5 + 120 + REAP_S
        worker.current = ("i1", time.monotonic() - last_ok, 5.0)
        assert worker.health() is None
        worker.current = ("i1", time.monotonic() - last_ok - STUCK_MARGIN_S - 1, 5.0)
        assert worker.health().startswith("the diagnosis worker is stuck: incident i1")
    finally:
        store.close()
