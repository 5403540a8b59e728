"""serve's worker runs each diagnosis in a process of its own and kills it at its deadline: a
diagnosis blocked for good in the kernel (open() of a FIFO, through the hangseam runner) ends its
incident as failed with the reason, nothing of it is left running, and the next incident, queued
behind it, is diagnosed. The alert delivered again is retried once, then no more."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

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
        # the first diagnosis's process is blocked in the kernel's FIFO open
        end = time.monotonic() + 30
        while not (kids := [k for k, cmd in _children().items() if "memdiag.diagnose.serve.child" in cmd]):
            assert time.monotonic() < end
            time.sleep(0.05)
        (child,) = kids
        end = time.monotonic() + 30
        while Path(f"/proc/{child}/wchan").read_text() != "wait_for_partner":
            assert time.monotonic() < end, Path(f"/proc/{child}/wchan").read_text()
            time.sleep(0.05)
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
