"""`memdiag serve` with real clients: a real Alertmanager (Debian's 0.25) sending webhooks with
bearer auth, plain POST /diagnose, the OOM watch on a real OOM kill, hostile requests refused,
incidents kept across a restart."""

import datetime as dt
import json
import signal
import socket
import time

from conftest import TOKEN, request
from figures import check_figures

MiB = 1 << 20


def _now(offset_s: float = 0) -> str:
    return (dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=offset_s)).isoformat()


def test_alertmanager_to_incident_end_to_end(server, alertmanager, workload):
    srv = server(extra=["--no-oom-watch"])  # the watch is host-wide: another test's OOM kill is an incident too
    am = alertmanager(srv.url + "/alerts/alertmanager")
    w = workload("leak", "2048")
    alert = [
        {
            "labels": {"alertname": "MemoryGrowth", "pid": str(w.pid), "severity": "page"},
            "annotations": {"summary": "orders RSS climbing"},
            "startsAt": _now(),
            "endsAt": _now(600),
        }
    ]
    status, _ = request(am + "/api/v2/alerts", "POST", json.dumps(alert).encode(), token=None)
    assert status == 200
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not srv.incidents():
        time.sleep(0.5)
    (incident,) = srv.incidents()  # exactly one incident for the alert
    assert incident["source"] == "alertmanager" and incident["target"]["pid"] == w.pid
    done = srv.wait(incident["id"])
    assert done["state"] == "done" and done["verdict_kind"] in ("leak", "growth")
    assert "leak_order_history" in done["summary"]
    md = srv.get(f"/incidents/{incident['id']}?format=md")[1].decode()
    assert md.startswith(f"# memdiag: {done['verdict_kind']} — PID {w.pid} (leak)")
    assert check_figures(json.loads(srv.get(f"/incidents/{incident['id']}?format=json")[1])) == []
    assert len(srv.incidents()) == 1  # no second incident from the same alert


def test_repeated_delivery_makes_one_incident_and_resolved_is_recorded(server, workload):
    srv = server()
    w = workload("churn", "1000")
    payload = {
        "version": "4",
        "status": "firing",
        "receiver": "memdiag",
        "groupKey": "{}:{}",
        "truncatedAlerts": 0,
        "groupLabels": {},
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://am",
        "someFutureField": {"x": 1},
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "M", "pid": str(w.pid)},
                "annotations": {},
                "startsAt": "2026-11-30T06:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": "f00dbabe",
            }
        ],
    }
    s1, r1 = srv.post("/alerts/alertmanager", payload)
    s2, r2 = srv.post("/alerts/alertmanager", payload)  # HA pair / retry: the same notification again
    assert s1 == s2 == 202
    assert r1["incidents"][0]["id"] == r2["incidents"][0]["id"] and r2["incidents"][0]["new"] is False
    resolved = json.loads(json.dumps(payload))
    resolved["alerts"][0].update(status="resolved", endsAt="2026-11-30T06:10:00Z")
    resolved["status"] = "resolved"
    s3, r3 = srv.post("/alerts/alertmanager", resolved)
    assert s3 == 202 and r3["incidents"][0]["state"] == "resolved"
    states = sorted(i["state"] for i in srv.incidents())
    assert len(states) == 2 and "resolved" in states


def test_hostile_requests_are_refused_and_leave_nothing(server, workload):
    srv = server()
    w = workload("churn", "1000")
    ok_alert = {"alerts": [{"status": "firing", "labels": {"pid": str(w.pid)}}]}
    assert srv.post("/alerts/alertmanager", ok_alert, token=None)[0] == 401
    assert srv.post("/alerts/alertmanager", ok_alert, token="wrong")[0] == 401
    # A body announced over the cap is refused before it is read. (Sending all of it would race
    # the server's early 413 against the client's writes: a broken pipe, not an answer.)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
        sock.sendall(
            f"POST /diagnose HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {2 << 20}\r\n\r\n".encode()
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than" in answer
    status, body = srv.post("/alerts/alertmanager", b'{"alerts": [')
    assert status == 400 and body["error"].startswith("malformed JSON")
    status, body = srv.post("/alerts/alertmanager", {"alerts": "nope"})
    assert status == 422 and body["error"].startswith("wrong payload shape")
    for labels in (
        {"id": "/../../etc/passwd"},
        {"container_id": "docker://$(reboot)"},
        {"pid": "1; rm -rf /"},
        {"uid": "../../x"},
    ):
        status, body = srv.post("/alerts/alertmanager", {"alerts": [{"status": "firing", "labels": labels}]})
        assert status == 422, (labels, body)
    status, body = srv.post(
        "/alerts/alertmanager",
        {"alerts": [{"status": "firing", "labels": {"container_id": "containerd://" + "ab" * 32}}]},
    )
    assert status == 404 and body["error"] == f"label container_id {'ab' * 32}: no such running container"
    status, body = srv.post("/diagnose", {"pid": 4000000})
    assert status == 404 and "no such process" in body["error"]
    status, body = srv.post("/diagnose", {"pid": w.pid, "extra": 1})
    assert status == 422
    # one bad alert in a group: nothing is made for the good one either
    mixed = {
        "alerts": [{"status": "firing", "labels": {"pid": str(w.pid)}}, {"status": "firing", "labels": {"id": "/../x"}}]
    }
    assert srv.post("/alerts/alertmanager", mixed)[0] == 422
    # (the OOM watch may record a kill from elsewhere on the host meanwhile: not from these requests)
    assert [i for i in srv.incidents() if i["source"] != "oomwatch"] == []
    statuses = [srv.post("/diagnose", b"{", token="wrong")[0] for _ in range(60)]
    assert 429 in statuses  # a flood is rate-limited


def test_grafana_signature(server, workload, tmp_path):
    import hashlib
    import hmac

    secret = tmp_path / "grafana-secret"
    secret.write_text("hush\n")
    secret.chmod(0o600)
    srv = server(
        extra=[
            "--grafana-secret-file",
            str(secret),
            "--grafana-timestamp-header",
            "X-Grafana-Alerting-Signature-Timestamp",
        ]
    )
    w = workload("churn", "1000")
    body = json.dumps(
        {
            "version": "1",
            "state": "alerting",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {"pid": str(w.pid)},
                    "silenceURL": "http://g/s",
                    "dashboardURL": "",
                    "fingerprint": "abc",
                    "startsAt": _now(),
                    "endsAt": _now(300),
                }
            ],
        }
    ).encode()
    ts = str(int(time.time()))
    good = hmac.new(b"hush", f"{ts}:".encode() + body, hashlib.sha256).hexdigest()
    headers = {"X-Grafana-Alerting-Signature-Timestamp": ts}
    status, _ = request(
        srv.url + "/alerts/grafana", "POST", body, headers={**headers, "X-Grafana-Alerting-Signature": "00" * 32}
    )
    assert status == 401
    status, raw = request(
        srv.url + "/alerts/grafana", "POST", body, headers={**headers, "X-Grafana-Alerting-Signature": good}
    )
    assert status == 202 and json.loads(raw)["incidents"][0]["new"] is True


def test_oom_watch_records_a_real_kill(server, workload, memcg):
    srv = server()
    srv.oom_watch_attached()
    cg = memcg(48 * MiB, swap=False)
    w = workload("hog", "256", "8", "20", cgroup=cg)
    assert w.wait_exit(30) == -9
    deadline = time.monotonic() + 20
    found = []
    while time.monotonic() < deadline and not found:
        found = [i for i in srv.incidents() if i["source"] == "oomwatch" and i["alert"]["victim_pid"] == w.pid]
        time.sleep(0.5)
    (incident,) = found
    assert incident["alert"]["memcg"] == cg.path and incident["alert"]["limit"] == 48 * MiB
    assert f"PID {w.pid} (hog)" in incident["summary"] and "cgroup limit" in incident["summary"]
    assert incident["state"] == "recorded"  # nothing left running in the cgroup to diagnose
    metrics = srv.get("/metrics")[1].decode()
    assert "memdiag_oom_kills_total 1.0" in metrics


def test_restart_keeps_incidents_and_requeues_the_cut_off_one(server, workload):
    srv = server(duration=20)
    w = workload("churn", "1000")
    status, body = srv.post("/diagnose", {"pid": w.pid})
    assert status == 202
    srv.wait(body["id"], states=("running",), timeout=30)
    srv.stop(kill=True)
    again = server()
    item = json.loads(again.get(f"/incidents/{body['id']}")[1])
    assert item["state"] in ("queued", "running")  # re-queued, and it says so
    assert item["previous"].startswith("attempt 1 interrupted: memdiag serve stopped during the diagnosis")
    html = again.get("/incidents?format=html")[1].decode()
    assert body["id"] in html and "<table" in html


def test_sigterm_and_sigint_stop_serve_with_one_line_and_the_shells_status(server, sleeper):
    """SIGTERM (systemd's stop) killed serve by the signal with nothing said; now both signals end it
    as the CLI's other commands end: one line, 128 + the signal."""
    for sig, status in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        srv = server(duration=30, extra=["--no-oom-watch"])
        code, body = srv.post("/diagnose", {"pid": sleeper()})
        srv.wait(body["id"], states=("running",), timeout=30)
        started = time.monotonic()
        srv.proc.send_signal(sig)
        _out, err = srv.proc.communicate(timeout=30)
        assert srv.proc.returncode == status, (sig, srv.proc.returncode, err)
        assert err.splitlines() == [
            f"memdiag: serve stopped by {sig.name}; diagnoses queued or cut off resume at the next start"
        ]
        assert time.monotonic() - started < 10  # not held by the 30 s diagnosis under way
        again = server(duration=1, extra=["--no-oom-watch"])  # same folder: the cut-off one resumes
        assert again.wait(body["id"], timeout=60)["attempts"] == 2
        again.stop()


def test_refuses_to_listen_off_loopback_without_token(memdiag, root_required, tmp_path):
    r = memdiag("serve", "--listen", "0.0.0.0:9", "--data", str(tmp_path))
    assert r.returncode == 2 and "refusing to listen off loopback without --token-file" in r.stderr
    assert TOKEN  # the fixtures' token is not used here


def test_read_token_guards_incidents_and_metrics(server, workload, tmp_path):
    read_file = tmp_path / "read-token"
    read_file.write_text("reader-7d2e\n")
    read_file.chmod(0o600)
    srv = server(extra=["--read-token-file", str(read_file)])
    w = workload("churn", "1000")
    status, body = srv.post("/diagnose", {"pid": w.pid, "duration": 5})
    assert status == 202
    iid = body["id"]
    for path in ("/incidents", f"/incidents/{iid}", "/metrics"):
        assert request(srv.url + path, token=None)[0] == 401, path
        assert request(srv.url + path, token="wrong")[0] == 401, path
        assert request(srv.url + path, token="reader-7d2e")[0] == 200, path
        assert request(srv.url + path)[0] == 200, path  # the POST token reads too
    assert request(srv.url + "/healthz", token=None)[0] == 200  # liveness stays open
    assert srv.post("/diagnose", {"pid": w.pid}, token="reader-7d2e")[0] == 401  # reading is not writing
    (item,) = json.loads(request(srv.url + "/incidents", token="reader-7d2e")[1])["incidents"]
    assert item["id"] == iid and item["target"]["pid"] == w.pid
