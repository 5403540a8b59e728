"""`memdiag serve --notify` end to end: a real server diagnoses and a real local webhook receiver
(tests/webhook.py, reached through apprise's json:// form) gets the verdict; a receiver that fails
twice gets it on the third attempt; one that always fails leaves the incident done and listed with
its delivery failed; a restart sends what was left, not what was delivered. The URL's secret never
shows in the incidents or serve's output."""

from __future__ import annotations

import json
import time

from conftest import Server
from webhook import Receiver

SECRET = "hookT0kenZq81"


def _notify_file(tmp_path, *urls: str):
    path = tmp_path / "notify"
    path.write_text("# where memdiag's verdicts go\n" + "".join(u + "\n" for u in urls))
    path.chmod(0o600)
    return str(path)


def _notified(srv: Server, iid: str, states=("delivered", "failed"), timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        item = json.loads(srv.get(f"/incidents/{iid}")[1])
        if (item.get("notify") or {}).get("state") in states:
            return item
        time.sleep(0.2)
    raise AssertionError(f"incident {iid}'s delivery never reached {states}: {item.get('notify')}")


def test_a_diagnosed_leak_is_posted_to_a_webhook_with_its_verdict_culprit_and_link(servers, workload, tmp_path):
    with Receiver([200]) as rx:
        notify = _notify_file(tmp_path, rx.url(f"/alerts-{SECRET}") + f"?+X-Hook-Key=k{SECRET}")
        public = "https://memdiag.example:8443/node-7"
        # a window long enough for the allocation probe to name the function (4 s gives `growth`, no stack)
        srv = servers(tmp_path / "data", duration=10, extra=["--notify", notify, "--public-url", public])
        w = workload("leak", "2048")
        status, body = srv.post("/diagnose", {"pid": w.pid})
        assert status == 202, body
        iid = body["id"]
        done = _notified(srv, iid)
        (post,) = rx.wait(1)
    assert done["state"] == "done" and done["verdict_kind"] in ("leak", "growth")
    assert done["culprit"] == "leak_order_history"
    assert done["notify"]["state"] == "delivered" and done["notify"]["attempts"] == 1
    assert post["path"] == f"/alerts-{SECRET}" and post["headers"]["X-Hook-Key"] == f"k{SECRET}"
    msg = post["body"]
    assert msg["title"] == f"memdiag: {done['verdict_kind']} — PID {w.pid} (leak)"
    assert msg["type"] == ("failure" if done["verdict_kind"] == "leak" else "warning")
    lines = msg["message"].splitlines()
    assert lines[0] == done["summary"] and "leak_order_history" in lines[0]
    assert lines[1:] == [
        "Culprit: leak_order_history",
        f"Incident: {iid} (api)",
        f"Report: {public}/incidents/{iid}?format=html",
    ]
    listing = srv.get("/incidents")[1].decode()
    assert json.loads(listing)["incidents"][0]["notify"]["state"] == "delivered"
    srv.stop()
    out, err = srv.proc.stdout.read(), srv.proc.stderr.read()
    assert f"incident {iid}: verdict delivered to json://127.0.0.1:{rx.port}/a...1 (attempt 1)" in out
    for text in (json.dumps(done), listing, out, err):
        assert SECRET not in text


def test_a_receiver_failing_twice_gets_the_verdict_on_the_third_attempt(servers, sleeper, tmp_path):
    with Receiver([500, 500, 200]) as rx:
        extra = ["--notify", _notify_file(tmp_path, rx.url()), "--notify-backoff", "0.2"]
        srv = servers(tmp_path / "data", duration=1, extra=extra)
        iid = srv.post("/diagnose", {"pid": sleeper()})[1]["id"]
        done = _notified(srv, iid)
        posts = rx.wait(3)
    assert done["state"] == "done" and done["notify"]["state"] == "delivered"
    assert done["notify"]["attempts"] == 3 and done["notify"]["error"] is None
    assert [p["status"] for p in posts] == [500, 500, 200]
    assert all(f"Incident: {iid} (api)" in p["body"]["message"] for p in posts)
    assert done["notify"]["destinations"][0]["to"] == f"json://127.0.0.1:{rx.port}/h...k"
    metrics = srv.get("/metrics")[1].decode()
    for outcome, count in (("delivered", 1), ("retried", 2)):
        assert f'memdiag_notifications_total{{outcome="{outcome}"}} {count:.1f}' in metrics.splitlines()


def test_a_slow_receiver_that_always_fails_never_holds_the_incidents(servers, sleeper, tmp_path):
    with Receiver([500], delay_s=2.0) as rx:
        extra = ["--notify", _notify_file(tmp_path, rx.url()), "--notify-attempts", "2", "--notify-backoff", "4"]
        srv = servers(tmp_path / "data", duration=1, extra=extra)
        first = srv.post("/diagnose", {"pid": sleeper()})[1]["id"]
        second = srv.post("/diagnose", {"pid": sleeper()})[1]["id"]
        items = [_notified(srv, iid, states=("failed",)) for iid in (first, second)]
        rx.wait(4)
    for item in items:
        assert item["state"] == "done" and item["verdict_kind"] is not None
        notify = item["notify"]
        assert notify["state"] == "failed" and notify["attempts"] == 2 and "error=500" in notify["error"]
    # the first's two sends took 2 s each, 4 s apart, ending >= 8 s after its diagnosis: the second
    # diagnosis, queued behind it, was done before they were (a worker that sent would finish it after)
    assert items[1]["updated"] < items[0]["notify"]["destinations"][0]["last_attempt"]
    listed = {i["id"]: i for i in srv.incidents()}
    assert {first, second} <= set(listed) and listed[first]["notify"]["state"] == "failed"
    assert srv.health()["ok"] is True  # a destination that fails is no health problem of serve's
    assert 'memdiag_notifications_total{outcome="failed"} 2.0' in srv.get("/metrics")[1].decode().splitlines()


def test_a_restarted_serve_sends_what_was_left_and_not_what_was_delivered(servers, sleeper, tmp_path):
    with Receiver([200, 500, 200]) as rx:
        notify = _notify_file(tmp_path, rx.url())
        extra = ["--notify", notify, "--notify-backoff", "600"]  # the retry is left to the restart
        srv = servers(tmp_path / "data", duration=1, extra=extra)
        sent = srv.post("/diagnose", {"pid": sleeper()})[1]["id"]
        assert _notified(srv, sent)["notify"]["state"] == "delivered"
        left = srv.post("/diagnose", {"pid": sleeper()})[1]["id"]
        assert _notified(srv, left, states=("retrying",))["notify"]["attempts"] == 1
        srv.stop()
        again = servers(tmp_path / "data", duration=1, extra=extra)
        assert _notified(again, left)["notify"]["state"] == "delivered"
        posts = rx.wait(3)
        time.sleep(1)  # time for a wrong second send of the delivered one
        ids = [p["body"]["message"].split("Incident: ")[1].split(" ")[0] for p in rx.received]
    assert ids == [sent, left, left] and [p["status"] for p in posts] == [200, 500, 200]
    assert json.loads(again.get(f"/incidents/{left}")[1])["notify"]["attempts"] == 2
    again.stop()
    assert "1 undelivered by the last stop sent again" in again.proc.stdout.read()
