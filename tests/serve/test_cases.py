"""serve keeps the case: incidents of one service linked across restarts, a done incident verified
through the API once a fix is deployed, and the OOM watch's diagnosis after a kill compared with
the service's earlier growth (does the restarted process grow the same way?). Real server, real
programs restarted as a supervisor would, a real OOM kill."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from kit import build, wait_until

MiB = 1 << 20
WINDOW = 20  # each diagnosis: the first look, a price and memleak's run fit
EXTRA = ["--budget", "5"]  # the budget tracing must fit: these tests check the linking, not the budget


def _diagnose_pid(srv, pid: int) -> dict:
    status, body = srv.post("/diagnose", {"pid": pid})
    assert status == 202, body
    return srv.wait(body["id"], timeout=WINDOW * 4)


def test_a_fix_is_verified_through_the_api_and_the_incidents_are_linked(server, workload, memcg):
    srv = server(duration=WINDOW, extra=EXTRA)
    cg = memcg(None)  # the service's own cgroup, as systemd gives one: it stays across restarts
    before = workload("errleak", "2000", cgroup=cg)
    first = _diagnose_pid(srv, before.pid)
    assert first["state"] == "done" and first["verdict_kind"] == "leak", first
    assert first["service"] == f"process errleak in {cg.path}" and first["related"] == []
    before.stop()
    after = workload("errleak", "2000", cgroup=cg, flags=["-DFIXED"])  # the fix, deployed: a new pid
    status, body = srv.post(f"/incidents/{first['id']}/verify", {})
    assert status == 202 and body["baseline"] == first["id"], body
    second = srv.wait(body["id"], timeout=WINDOW * 4)
    assert second["state"] == "done", second
    assert second["baseline"] == first["id"] and second["verification"] == "fixed", second
    assert second["target"]["pid"] == after.pid
    assert [r["id"] for r in second["related"]] == [first["id"]]
    assert second["related"][0]["verdict_kind"] == "leak"
    md = srv.get(f"/incidents/{second['id']}?format=md")[1].decode()
    assert "## Verification" in md and "`process_order` is fixed" in md
    # bad follow-ups: one JSON line each
    assert srv.post("/incidents/0123456789abcdef/verify", {})[0] == 404
    after.stop()
    status, body = srv.post(f"/incidents/{first['id']}/verify", {})
    assert status == 422 and "cannot be found again" in body["error"], body


def test_after_an_oom_kill_the_restarted_service_is_compared_with_its_earlier_growth(server, memcg):
    """A leaking service under a supervisor: diagnosed growing, then killed at its limit and
    restarted; the OOM watch waits for the restart, diagnoses it and says it grows the same way."""
    srv = server(duration=WINDOW, extra=EXTRA)
    srv.oom_watch_attached()
    cg = memcg(64 * MiB, swap=False)
    leak = build("errleak")
    loop = subprocess.Popen(  # ~1.1 MiB/s: a kill about a minute in, then at once a restart
        ["sh", "-c", f"while :; do {leak} 2000 7 4096 >/dev/null; done"],
        stderr=subprocess.DEVNULL,
        preexec_fn=lambda: cg.procs_file.write_text(str(os.getpid())),
    )
    try:
        wait_until(lambda: _errleak_in(cg) is not None, "the service running")
        first = _diagnose_pid(srv, _errleak_in(cg))
        assert first["verdict_kind"] in ("leak", "growth"), first
        wait_until(lambda: cg.oom_kills() >= 1, "the service's first OOM kill", timeout=180)
        kill = _oom_incident(srv, cg)
        done = srv.wait(kill["id"], timeout=WINDOW * 5)
        assert done["state"] == "done", done
        assert done["baseline"] == first["id"] and done["verification"] == "still-leaking", done
        report = json.loads(srv.get(f"/incidents/{kill['id']}?format=json")[1])
        assert report["verification"]["found_by"].startswith("the OOM watch, after a kill")
        assert report["target"]["comm"] == "errleak" and report["target"]["pid"] != first["target"]["pid"]
        assert first["id"] in [r["id"] for r in done["related"]]
    finally:
        loop.kill()
        loop.wait()
        for pid in cg.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _errleak_in(cg) -> int | None:
    for pid in cg.pids():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "errleak":
                return pid
    return None


def _oom_incident(srv, cg) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [i for i in srv.incidents() if i["source"] == "oomwatch" and (i["alert"] or {}).get("memcg") == cg.path]
        if found:
            return found[-1]
        time.sleep(0.5)
    raise AssertionError("no OOM-watch incident for the kill")
