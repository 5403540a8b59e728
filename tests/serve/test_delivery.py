"""`memdiag serve` loses nothing and its worker never dies, under real faults: a tmpfs that fills
during a diagnosis, kill -9 mid-diagnosis then Alertmanager's re-delivery, a flood past the queue
re-delivered until accepted, a group larger than the queue delivered by Alertmanager, two servers
on one folder, planted symlinks and loose modes."""

from __future__ import annotations

import collections
import datetime as dt
import json
import os
import re
import stat
import subprocess
import time

import pytest
from conftest import Server, request


def _incident(srv: Server, iid: str) -> dict:
    return json.loads(srv.get(f"/incidents/{iid}")[1])


def _all(srv: Server) -> list[dict]:
    out, offset = [], 0
    while offset is not None:
        page = json.loads(srv.get(f"/incidents?limit=200&offset={offset}")[1])
        out += page["incidents"]
        offset = page["next_offset"]
    return out


def _metric(srv: Server, name: str, labels: str) -> float:
    text = srv.get("/metrics")[1].decode()
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _healthz(srv: Server) -> tuple[int, dict]:
    status, raw = request(srv.url + "/healthz", token=None)
    return status, json.loads(raw)


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"never: {what}")


def _am_group(pid: int, fingerprints: list[str]) -> dict:
    """A webhook as Alertmanager sends it: firing alerts carry the zero endsAt."""
    return {
        "version": "4",
        "status": "firing",
        "receiver": "memdiag",
        "groupKey": "{}:{}",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": f"Growth-{fp}", "pid": str(pid)},
                "annotations": {},
                "startsAt": "2026-11-30T06:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "fingerprint": fp,
            }
            for fp in fingerprints
        ],
    }


@pytest.fixture
def small_tmpfs(root_required, tmp_path):
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    # mode 700: a tmpfs root is 1777 by default, and a data folder others can write to is refused
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_during_a_diagnosis_fails_it_and_the_worker_goes_on(servers, small_tmpfs, sleeper):
    srv = servers(small_tmpfs, duration=3)
    pid = sleeper()
    status, body = srv.post("/alerts/alertmanager", _am_group(pid, ["full"]))
    assert status == 202
    iid = body["incidents"][0]["id"]
    srv.wait(iid, states=("running",), timeout=30)
    filler = small_tmpfs / "filler"
    dd = subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, text=True)
    assert "No space left" in dd.stderr  # the folder is full while the diagnosis runs
    failed = srv.wait(iid, timeout=60)
    assert failed["state"] == "failed" and "No space left" in failed["error"], failed
    assert not (small_tmpfs / "reports" / iid).exists()  # nothing half-written is left
    status, health = _healthz(srv)
    assert status == 503 and "storage failing" in health["reason"] and "No space left" in health["reason"]
    filler.unlink()
    _until(lambda: _healthz(srv)[0] == 200, 10, "healthz back to 200 after space is freed")
    assert srv.wait(iid)["state"] == "failed"  # the outcome was kept (in the database by now)
    status, again = srv.post("/diagnose", {"pid": pid})
    assert status == 202
    done = srv.wait(again["id"], timeout=60)  # the same worker thread, still alive
    assert done["state"] == "done", done
    md = srv.get(f"/incidents/{again['id']}?format=md")[1].decode()
    assert f"PID {pid} (sleep)" in md
    # Alertmanager delivers the failed alert again: it is diagnosed now, on the same incident
    status, body = srv.post("/alerts/alertmanager", _am_group(pid, ["full"]))
    assert status == 202 and body["incidents"][0] == {
        "id": iid,
        "state": "queued",
        "new": True,
        "requeued": True,
        "attempts": 1,
    }
    done = srv.wait(iid, timeout=60)
    assert done["state"] == "done" and done["attempts"] == 2 and done["error"] is None
    assert done["previous"].startswith("attempt 1 failed: writing the report: No space left on device")


def test_a_done_alert_is_diagnosed_again_only_after_the_window(servers, sleeper, tmp_path):
    srv = servers(tmp_path / "data", duration=1, extra=["--dedupe-window", "4"])
    group = _am_group(sleeper(), ["win"])
    iid = srv.post("/alerts/alertmanager", group)[1]["incidents"][0]["id"]
    first = srv.wait(iid, timeout=60)
    assert first["state"] == "done" and first["runtime"] == "none"  # sleep(1) is native code
    status, body = srv.post("/alerts/alertmanager", group)  # a repeat within the window
    assert status == 202 and body["incidents"][0]["new"] is False
    time.sleep(max(0.0, first["updated"] + 4.2 - time.time()))
    status, body = srv.post("/alerts/alertmanager", group)  # past it: a fresh look, same incident
    assert status == 202 and body["incidents"][0]["new"] is True and body["incidents"][0]["id"] == iid
    again = srv.wait(iid, timeout=60)
    assert again["state"] == "done" and again["attempts"] == 1 and again["updated"] > first["updated"]
    assert again["previous"] == f"done earlier: {first['verdict_kind']}: {first['summary']}"
    assert len(_all(srv)) == 1


def test_kill9_mid_diagnosis_is_resumed_and_a_redelivery_is_not_diagnosed_again(
    servers, alertmanager, sleeper, tmp_path
):
    srv = servers(tmp_path / "data", duration=6)
    am = alertmanager(srv.url + "/alerts/alertmanager", repeat_interval="8s")
    pid = sleeper()
    now = dt.datetime.now(dt.timezone.utc)
    alert = [
        {
            "labels": {"alertname": "MemoryGrowth", "pid": str(pid)},
            "startsAt": now.isoformat(),
            "endsAt": (now + dt.timedelta(minutes=10)).isoformat(),
        }
    ]
    assert request(am + "/api/v2/alerts", "POST", json.dumps(alert).encode(), token=None)[0] == 200
    (first,) = _until(srv.incidents, 30, "Alertmanager delivered the alert")
    srv.wait(first["id"], states=("running",), timeout=30)
    srv.stop(kill=True)  # kill -9 mid-diagnosis
    srv.start()  # same folder, same port: Alertmanager's target again
    item = _incident(srv, first["id"])
    assert item["state"] in ("queued", "running")
    assert item["previous"].startswith("attempt 1 interrupted: memdiag serve stopped during the diagnosis")
    done = srv.wait(first["id"], timeout=60)
    assert done["state"] == "done" and done["attempts"] == 2, done
    seen = _metric(srv, "memdiag_alerts_received_total", 'source="alertmanager"')
    _until(
        lambda: _metric(srv, "memdiag_alerts_received_total", 'source="alertmanager"') > seen,
        40,
        "Alertmanager re-delivered the alert after it was diagnosed",
    )
    assert _metric(srv, "memdiag_alert_deliveries_total", 'outcome="duplicate"') >= 1
    (only,) = _all(srv)  # one incident, diagnosed once after the restart
    assert only["id"] == first["id"] and only["state"] == "done" and only["attempts"] == 2


def test_flood_past_the_queue_redelivered_until_accepted_is_diagnosed_exactly_once(servers, sleeper, tmp_path):
    srv = servers(tmp_path / "data", duration=2, extra=["--queue", "2"])
    pid = sleeper()
    # a group needing 3 diagnoses when 2 fit: the 2 are queued, the third is left for the redelivery
    status, body = srv.post("/alerts/alertmanager", _am_group(pid, ["g1", "g2", "g3"]))
    assert status == 429 and body["error"].startswith("diagnosis queue is full: 1 of 3 firing alerts not stored")
    assert [i["new"] for i in body["incidents"]] == [True, True]
    assert json.loads(srv.get("/incidents")[1])["total"] == 2
    groups = [["g1", "g2", "g3"], *([f"flood{i:02d}"] for i in range(6))]  # three times the queue, and more
    refused, rounds, started = list(groups), 0, time.monotonic()
    while refused and time.monotonic() - started < 120:
        rounds += 1
        for group in list(refused):  # Alertmanager delivers again the groups it could not deliver
            status, body = srv.post("/alerts/alertmanager", _am_group(pid, group))
            assert status == 202 or (status == 429 and "queue is full" in body["error"]), body
            if status == 202:
                refused.remove(group)
        time.sleep(1)
    assert not refused and rounds > 1  # some were refused at first, all accepted in the end
    for group in groups:  # and every group once more (a repeat): nothing is diagnosed twice
        status, body = srv.post("/alerts/alertmanager", _am_group(pid, group))
        assert status == 202 and not any(i["new"] for i in body["incidents"]), body
        time.sleep(0.1)
    incidents = _until(lambda: _settled(srv), 120, "every incident done or failed")
    states = collections.Counter((i["state"], i["attempts"]) for i in incidents)
    assert set(states) == {("done", 1)}, (states, _healthz(srv))  # each diagnosed once, none failed
    per_alert = collections.Counter(i["alert"]["fingerprint"] for i in incidents)
    assert per_alert == collections.Counter(fp for group in groups for fp in group)  # one incident per alert
    took = sorted(i["duration_s"] for i in incidents)
    print(f"flood: {rounds} delivery rounds; one diagnosis took {took[0]:.1f}-{took[-1]:.1f} s")
    assert _metric(srv, "memdiag_alert_groups_refused_total", 'reason="queue full"') >= 2


def _settled(srv: Server) -> list[dict] | None:
    incidents = _all(srv)
    return incidents if incidents and all(i["state"] in ("done", "failed") for i in incidents) else None


def test_a_group_larger_than_the_queue_from_alertmanager_is_diagnosed_whole_each_alert_once(
    servers, alertmanager, sleeper, tmp_path
):
    """One notification of 12 firing alerts against --queue 4 (three times what fits: three deliveries at
    least; 40 took 72 s of the suite for no more behaviour). All-or-nothing admission refused such
    a group forever (17 alerts with --queue 16: 429 six times on an idle server); now each delivery
    queues what fits and answers 429 for the rest, which Alertmanager (Debian's 0.25) delivers again
    by itself at its next group_interval (5 s here), until every alert has its incident."""
    n = 12
    srv = servers(tmp_path / "data", duration=1, extra=["--queue", "4"])
    am = alertmanager(srv.url + "/alerts/alertmanager", repeat_interval="10s")
    pid = sleeper()
    now = dt.datetime.now(dt.timezone.utc)
    alerts = [
        {
            "labels": {"alertname": "MemoryGrowth", "pid": str(pid), "shard": f"s{i:02d}"},  # one group: alertname, pid
            "startsAt": now.isoformat(),
            "endsAt": (now + dt.timedelta(minutes=30)).isoformat(),
        }
        for i in range(n)
    ]
    assert request(am + "/api/v2/alerts", "POST", json.dumps(alerts).encode(), token=None)[0] == 200
    started = time.monotonic()
    incidents = _until(lambda: len(_all(srv)) == n and _settled(srv), 300, f"{n} incidents done")
    took = time.monotonic() - started
    assert collections.Counter((i["state"], i["attempts"]) for i in incidents) == {("done", 1): n}
    assert sorted(i["alert"]["labels"]["shard"] for i in incidents) == [f"s{i:02d}" for i in range(n)]
    assert all(i["target"]["pid"] == pid for i in incidents)
    refused = _metric(srv, "memdiag_alert_groups_refused_total", 'reason="queue full"')
    received = _metric(srv, "memdiag_alerts_received_total", 'source="alertmanager"')
    assert refused >= 1 and received >= 2 * n  # the group came whole, was taken in part, and came again
    print(f"{n} alerts, --queue 4: all done in {took:.0f} s; {refused:g} deliveries answered 429 in part")
    # delivered again (repeat_interval) once all are done: duplicates, nothing diagnosed twice
    _until(
        lambda: _metric(srv, "memdiag_alerts_received_total", 'source="alertmanager"') >= received + n,
        60,
        "Alertmanager delivered the group again",
    )
    assert _metric(srv, "memdiag_alert_deliveries_total", 'outcome="duplicate"') >= n
    again = _all(srv)
    assert len(again) == n and collections.Counter((i["state"], i["attempts"]) for i in again) == {("done", 1): n}


def test_a_locked_database_keeps_the_outcome_in_memory_until_it_can_be_written(servers, sleeper, tmp_path):
    import sqlite3

    srv = servers(tmp_path / "data", duration=2)
    status, body = srv.post("/diagnose", {"pid": sleeper()})
    srv.wait(body["id"], states=("running",), timeout=30)
    other = sqlite3.connect(tmp_path / "data" / "incidents.sqlite3", isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")  # another process holds the database's write lock
        done = srv.wait(body["id"], timeout=60)  # answered from memory
        assert done["state"] == "done"
        status, health = _healthz(srv)
        assert status == 503 and "1 outcomes kept in memory" in health["reason"] and "locked" in health["reason"]
        row = other.execute("SELECT state FROM incidents WHERE id=?", (body["id"],)).fetchone()
        assert row == ("running",)  # not yet in the database
        other.execute("ROLLBACK")
        _until(lambda: _healthz(srv)[0] == 200, 10, "the kept outcome written once the lock is gone")
        row = other.execute("SELECT state, verdict_kind FROM incidents WHERE id=?", (body["id"],)).fetchone()
        assert row == ("done", done["verdict_kind"])
    finally:
        other.close()


def test_two_servers_on_one_folder_the_second_exits_2(servers, sleeper, tmp_path):
    data = tmp_path / "data"
    first = servers(data, duration=4)
    pid = sleeper()
    status, body = first.post("/diagnose", {"pid": pid})
    first.wait(body["id"], states=("running",), timeout=30)
    second = Server(data, duration=4)
    proc = subprocess.run(second.cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"memdiag: --data {data}: another memdiag serve (pid {first.proc.pid}) is using this folder; "
        "one server per data folder"
    ]
    done = first.wait(body["id"])  # untouched: not marked interrupted, not run twice
    assert done["state"] == "done" and done["attempts"] == 1 and done["previous"] is None


def test_a_crash_looping_diagnosis_is_capped(servers, sleeper, tmp_path):
    srv = servers(tmp_path / "data", duration=20, extra=["--max-attempts", "1"])
    status, body = srv.post("/diagnose", {"pid": sleeper()})
    srv.wait(body["id"], states=("running",), timeout=30)
    srv.stop(kill=True)
    srv.start()
    item = _incident(srv, body["id"])
    assert item["state"] == "failed" and item["attempts"] == 1
    assert item["error"] == (
        "interrupted in each of 1 attempts (memdiag serve stopped during the diagnosis): not retried"
    )
    assert _healthz(srv)[0] == 200


def test_data_folder_is_owner_only_bounded_and_follows_no_symlink(servers, sleeper, tmp_path, memdiag):
    data = tmp_path / "data"
    (data / "reports" / "old").mkdir(parents=True)
    (data / "reports" / "old" / "report.md").write_text("x")
    (data / "incidents.sqlite3").touch()
    for p, mode in ((data, 0o755), (data / "reports", 0o777), (data / "incidents.sqlite3", 0o644)):
        p.chmod(mode)
    (data / "reports" / "old" / "report.md").chmod(0o644)
    srv = servers(data, duration=1, extra=["--max-incidents", "20"])
    pid = sleeper()
    status, body = srv.post("/diagnose", {"pid": pid})
    outside = tmp_path / "outside"
    outside.mkdir()
    planted = data / "reports" / body["id"]
    if not planted.exists():  # a symlink planted where the report goes is replaced, not followed
        planted.symlink_to(outside)
    assert srv.wait(body["id"])["state"] == "done"
    assert list(outside.iterdir()) == [] and not planted.is_symlink()
    for p in (data, data / "reports", data / "reports" / "old", planted):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700, p
    for name in ("incidents.sqlite3", "incidents.sqlite3-wal", "serve.lock", "reports/old/report.md"):
        assert stat.S_IMODE((data / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE((planted / "report.md").stat().st_mode) == 0o600
    (planted / "report.md").unlink()
    status, raw = srv.get(f"/incidents/{body['id']}?format=md")
    assert status == 410 and "report file report.md" in json.loads(raw)["error"]

    # stored records are bounded; the listing is paginated with a total; the oldest finished go
    big = {"status": "resolved", "labels": {"pid": str(pid)}, "annotations": {"description": "x" * 8_000}}
    assert srv.post("/alerts/alertmanager", {"alerts": [{**big, "fingerprint": "big"}]})[0] == 202
    for i in range(24):
        small = {"status": "resolved", "labels": {"pid": str(pid)}, "fingerprint": f"r{i}"}
        assert srv.post("/alerts/alertmanager", {"alerts": [small]})[0] == 202
    page = json.loads(srv.get("/incidents?limit=7&offset=7")[1])
    assert page["total"] == 20 and len(page["incidents"]) == 7 and page["next_offset"] == 14
    assert srv.get("/incidents?limit=100000")[0] == 400
    kept = _all(srv)
    assert len(kept) == 20 and body["id"] not in {i["id"] for i in kept}  # the oldest finished one was evicted
    assert not planted.exists()  # and its report folder with it
    assert "big" not in {i["alert"]["fingerprint"] for i in kept}  # evicted too (it was older than r0..r23)

    # a planted symlink for the database is refused with one line
    other = tmp_path / "other"
    other.mkdir()
    (other / "incidents.sqlite3").symlink_to(tmp_path / "elsewhere.db")
    r = memdiag("serve", "--data", str(other), "--listen", "127.0.0.1:9")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "symbolic link" in r.stderr
    assert not (tmp_path / "elsewhere.db").exists()


def test_stored_alert_records_are_truncated_and_say_so(tmp_path):
    from diagnose.serve.store import Limits, Store

    store = Store(tmp_path / "data", Limits(max_value_chars=100, max_record_bytes=2000))
    try:
        alert = {"labels": {"a": "b"}, "annotations": {"description": "y" * 5000, "note": "short"}}
        incident, new = store.record("alertmanager", "resolved", None, alert)
        stored = store.get(incident.id).alert
        assert new and stored["annotations"]["note"] == "short"
        assert stored["annotations"]["description"].endswith("… [truncated, 5000 characters]")
        assert len(stored["annotations"]["description"]) < 200 and stored["truncated"] == ["annotations.description"]
        many = {"labels": {}, "annotations": {f"k{i}": "z" * 90 for i in range(50)}}
        stored = store.get(store.record("alertmanager", "resolved", None, many)[0].id).alert
        assert stored["annotations"] == {"_dropped": "annotations over 2000 bytes: not stored"}
        assert stored["truncated"] == ["annotations"]
    finally:
        store.close()
    assert os.stat(tmp_path / "data" / "incidents.sqlite3").st_mode & 0o077 == 0
