"""serve's HTTP handlers in-process (Starlette's TestClient), without root: a real Store in a
temporary folder and a fake worker that queues without diagnosing. What the real-server tests in
tests/serve show over HTTP, here for the handler logic alone: webhook intake (accept, dedupe, a
group queued as far as there is room and the rest 429), authentication and its rate limit,
/healthz, /incidents paging and the refusals of bad requests. The targets are real processes this test starts."""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import subprocess
import threading

import pytest
from kit import GO_ENV
from memdiag.diagnose.render import render_all
from memdiag.diagnose.serve.app import MAX_PAGE, Config, Metrics, create_app, oom_watch_state
from memdiag.diagnose.serve.recorder import Recorder
from memdiag.diagnose.serve.security import FailureLimiter
from memdiag.diagnose.serve.store import Store
from memdiag.diagnose.serve.worker import Job, admit_into
from starlette.testclient import TestClient
from unit.test_render import fixture_report  # the renderers' fixture report (tests/ is on the path)

TOKEN, READ = "fast-token-9c2e", "fast-read-77a1"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class FakeWorker:
    """The worker's own admission (worker.admit_into: what fits of a group, duplicates not queued)
    over the real Store, with a queue nothing drains: what is queued stays there to be looked at."""

    def __init__(self, store: Store, maxsize: int = 4):
        self.store, self.maxsize = store, maxsize
        self.queued: list[Job] = []
        self.current = None
        self.problem: str | None = None

    def admit(self, jobs: list[Job]) -> list:
        return admit_into(self.store, jobs, self.maxsize - len(self.queued), lambda iid, job: self.queued.append(job))

    def qsize(self) -> int:
        return len(self.queued)

    def health(self) -> str | None:
        return self.problem


class FakeWatcher:
    def __init__(self, ready: bool, error: str | None = None):
        self.ready, self.error = threading.Event(), error
        if ready:
            self.ready.set()


@pytest.fixture
def target():
    """A real process to name in alerts; killed at the end."""
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def serve(tmp_path):
    """make(**config) -> (TestClient, store, worker); every store closed at the end."""
    made = []

    def make(maxsize: int = 4, **kw):
        store = Store(tmp_path / f"data-{len(made)}")
        worker = FakeWorker(store, maxsize)
        cfg = Config(store=store, worker=worker, token=kw.pop("token", TOKEN), **kw)
        made.append(store)
        return TestClient(create_app(cfg, Metrics(store)), raise_server_exceptions=False), store, worker

    yield make
    for store in made:
        store.close()


def _group(*alerts: dict) -> dict:
    return {"version": "4", "status": "firing", "receiver": "memdiag", "alerts": list(alerts)}


def _alert(pid: int, fingerprint: str, status: str = "firing") -> dict:
    return {
        "status": status,
        "labels": {"alertname": "MemoryGrowth", "pid": str(pid)},
        "startsAt": "2026-11-30T06:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-30T06:10:00Z",
        "fingerprint": fingerprint,
    }


def test_webhook_accepts_a_firing_alert_and_queues_its_target(serve, target):
    client, store, worker = serve()
    r = client.post("/alerts/alertmanager", json=_group(_alert(target, "f1")), headers=AUTH)
    assert r.status_code == 202
    (item,) = r.json()["incidents"]
    assert item["state"] == "queued" and item["new"] is True
    (job,) = worker.queued
    assert job.source == "alertmanager" and job.target.pid == target and job.target_json["pid"] == target
    assert job.alert["labels"]["pid"] == str(target)
    stored = store.get(item["id"])
    assert stored.source == "alertmanager" and stored.target["pid"] == target and stored.state == "queued"


def test_the_same_notification_twice_is_one_incident_and_resolved_is_recorded(serve, target):
    client, store, worker = serve()
    first = client.post("/alerts/alertmanager", json=_group(_alert(target, "f2")), headers=AUTH).json()
    again = client.post("/alerts/alertmanager", json=_group(_alert(target, "f2")), headers=AUTH).json()
    assert again["incidents"][0] == {**first["incidents"][0], "new": False}
    assert len(worker.queued) == 1  # the duplicate is not diagnosed twice
    r = client.post("/alerts/alertmanager", json=_group(_alert(target, "f2", "resolved")), headers=AUTH)
    (resolved,) = r.json()["incidents"]
    assert r.status_code == 202 and resolved["state"] == "resolved" and resolved["new"] is True
    assert store.get(resolved["id"]).summary == "alert resolved: recorded, not diagnosed"
    assert len(worker.queued) == 1 and store.counts() == {"queued": 1, "resolved": 1}


def test_a_group_larger_than_the_queue_room_is_taken_as_far_as_it_fits_then_429(serve, target):
    client, store, worker = serve(maxsize=2)
    group = _group(*(_alert(target, f"g{i}") for i in range(3)), _alert(target, "g-done", "resolved"))
    r = client.post("/alerts/alertmanager", json=group, headers=AUTH)
    assert r.status_code == 429
    body = r.json()
    assert body["error"] == (
        "diagnosis queue is full: 1 of 3 firing alerts not stored, deliver the group again later "
        "(the incidents listed were stored: delivered again, they are duplicates)"
    )
    assert [(i["state"], i["new"]) for i in body["incidents"]] == [("queued", True)] * 2 + [("resolved", True)]
    assert [j.alert["fingerprint"] for j in worker.queued] == ["g0", "g1"]  # in the group's order
    assert store.counts() == {"queued": 2, "resolved": 1}
    # the queue full: nothing of a group fits, nothing of it is stored (not even its resolved alert)
    r = client.post(
        "/alerts/alertmanager", json=_group(_alert(target, "h0"), _alert(target, "h-done", "resolved")), headers=AUTH
    )
    assert (r.status_code, r.json()) == (429, {"error": "diagnosis queue is full: nothing stored, deliver again later"})
    assert store.counts() == {"queued": 2, "resolved": 1}
    worker.queued.clear()  # diagnosed: room again, and the group delivered again takes the rest
    r = client.post("/alerts/alertmanager", json=group, headers=AUTH)
    assert r.status_code == 202
    assert [i["new"] for i in r.json()["incidents"]] == [False, False, True, False]
    assert [j.alert["fingerprint"] for j in worker.queued] == ["g2"]
    assert store.counts() == {"queued": 3, "resolved": 1}
    r = client.post("/diagnose", json={"pid": target}, headers=AUTH)
    assert r.status_code == 202
    r = client.post("/diagnose", json={"pid": target}, headers=AUTH)
    assert (r.status_code, r.json()) == (429, {"error": "diagnosis queue is full: nothing stored, deliver again later"})
    metrics = client.get("/metrics").text
    assert 'memdiag_alert_groups_refused_total{reason="queue full"} 3.0' in metrics
    assert 'memdiag_alert_deliveries_total{outcome="new"} 3.0' in metrics
    assert 'memdiag_alert_deliveries_total{outcome="duplicate"} 2.0' in metrics


def test_a_target_not_on_this_host_is_404_and_a_bad_label_422(serve):
    client, store, _ = serve()
    r = client.post("/alerts/alertmanager", json=_group(_alert(4194304, "gone")), headers=AUTH)
    assert r.status_code == 404 and "4194304" in r.json()["error"]
    bad = _alert(1, "bad")
    bad["labels"]["pid"] = "one"
    r = client.post("/alerts/alertmanager", json=_group(bad), headers=AUTH)
    assert r.status_code == 422 and "pid" in r.json()["error"]
    assert store.counts() == {}


def test_bad_bodies_are_refused_with_one_reason(serve):
    client, store, _ = serve()
    post = client.post
    assert post("/alerts/alertmanager", content=b"{", headers=AUTH).json()["error"].startswith("malformed JSON")
    deep = b"[" * 20 + b"]" * 20
    r = post("/alerts/alertmanager", content=deep, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"] == "malformed JSON: nested deeper than 16 levels"
    r = post("/alerts/alertmanager", json={"alerts": []}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"].startswith("wrong payload shape: alerts:")
    r = post("/alerts/alertmanager", content=b"x" * ((1 << 20) + 1), headers=AUTH)
    assert r.status_code == 413 and r.json()["error"] == "body larger than 1048576 bytes"
    r = post("/diagnose", json={"pid": 1, "cgroup": "/x"}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"] == "name exactly one of pid, cgroup, container_id, container"
    assert store.counts() == {}


def test_diagnose_queues_a_pid_with_its_window(serve, target):
    client, store, worker = serve()
    r = client.post("/diagnose", json={"pid": target, "duration": 7.5}, headers=AUTH)
    assert r.status_code == 202 and r.json()["state"] == "queued"
    (job,) = worker.queued
    assert job.source == "api" and job.target.pid == target and job.duration == 7.5 and job.dedup_key is None
    assert store.get(r.json()["id"]).target["pid"] == target


def test_a_wrong_token_is_401_then_429_for_that_address(serve, target):
    client, store, _ = serve(limiter=FailureLimiter(rate_per_s=0.001, burst=2))
    wrong = {"Authorization": "Bearer nope"}
    codes = [client.post("/diagnose", json={"pid": target}, headers=wrong).status_code for _ in range(3)]
    assert codes == [401, 401, 429]
    r = client.post("/diagnose", json={"pid": target}, headers=wrong)
    assert r.json() == {"error": "too many failed authentications from this address"}
    assert client.post("/diagnose", json={"pid": target}).status_code == 429  # no token: a failure too
    assert client.post("/diagnose", json={"pid": target}, headers=AUTH).status_code == 202  # the right one passes
    assert store.counts() == {"queued": 1}


def test_reads_need_the_read_token_or_the_write_token(serve):
    client, _, _ = serve(read_token=READ)
    assert client.get("/incidents").status_code == 401
    assert client.get("/incidents", headers={"Authorization": "Bearer x"}).json() == {
        "error": "missing or wrong bearer token (reads need the read token)"
    }
    assert client.get("/incidents", headers={"Authorization": f"Bearer {READ}"}).status_code == 200
    assert client.get("/metrics", headers=AUTH).status_code == 200
    assert client.post("/diagnose", json={"pid": 1}, headers={"Authorization": f"Bearer {READ}"}).status_code == 401
    assert client.get("/healthz").status_code == 200  # health is open: a probe has no token


def test_healthz_says_queue_problems_and_the_oom_watch(serve, target):
    client, _, worker = serve(oom_watch=FakeWatcher(ready=True))
    client.post("/diagnose", json={"pid": target}, headers=AUTH)
    assert client.get("/healthz").json() == {
        "ok": True,
        "queued": 1,
        "running": None,
        "oom_watch": "attached",
        "recorder": "off",
    }
    worker.problem = "the diagnosis worker has stopped"
    r = client.get("/healthz")
    assert r.status_code == 503 and r.json()["reason"] == "the diagnosis worker has stopped"
    client, _, _ = serve(checks=(lambda: "Alertmanager at http://am: connection refused",))
    assert client.get("/healthz").json()["reason"] == "Alertmanager at http://am: connection refused"
    assert client.get("/healthz?scope=process").json()["ok"] is True  # liveness: only this process's own
    assert client.get("/healthz").json()["oom_watch"] == "off"


def test_the_flight_recorder_is_read_whole_or_by_cgroup_and_bad_paths_are_one_line(serve):
    client, _, _ = serve()
    assert client.get("/cgroups").json() == {"error": "the flight recorder is off (memdiag serve --no-recorder)"}
    rec = Recorder(faults=False)
    rec.tick()
    rec.tick()
    client, _, _ = serve(recorder=rec)
    listed = client.get("/cgroups").json()
    assert listed["rounds"] == 2 and "/" in [c["path"] for c in listed["cgroups"]]
    health = client.get("/healthz").json()["recorder"]
    assert health["rounds"] == 2 and health["series_bytes"] == listed["series_bytes"] > 0
    root = client.get("/cgroups", params={"path": "/"}).json()
    assert root["fields"] == ["usage", "limit", "anon", "file", "shmem", "kernel"] and len(root["points"]) == 2
    later = client.get("/cgroups", params={"path": "/", "since": str(root["points"][1][0])}).json()
    assert [p[0] for p in later["points"]] == [root["points"][1][0]]
    r = client.get("/cgroups", params={"path": "/no/such/cgroup"})
    assert r.status_code == 404 and r.json() == {"error": "the recorder keeps no cgroup /no/such/cgroup"}
    assert client.get("/cgroups", params={"path": "system.slice"}).status_code == 400
    assert client.get("/cgroups", params={"path": "/", "since": "yesterday"}).json() == {
        "error": "since is a Unix time in seconds"
    }


def test_a_recorder_whose_rounds_stopped_is_a_problem_of_this_process(serve):
    rec = Recorder(faults=False)
    rec.tick()
    rec._thread = threading.current_thread()  # as if started: its rounds are then expected
    client, _, _ = serve(recorder=rec)
    assert client.get("/healthz?scope=process").status_code == 200
    rec.last_round_at -= 3 * rec.every_s + 31  # a round that never ended (a read held for ever)
    r = client.get("/healthz?scope=process")  # a liveness probe's question: a restart mends it
    assert r.status_code == 503 and "the flight recorder's last round ended" in r.json()["reason"]


def test_oom_watch_states():
    assert oom_watch_state(None) == "off"
    assert oom_watch_state(FakeWatcher(ready=False)) == "starting"
    assert oom_watch_state(FakeWatcher(ready=True)) == "attached"
    assert oom_watch_state(FakeWatcher(ready=True, error="no BTF")) == "unavailable: no BTF"


def test_incidents_are_paged_newest_first(serve, target):
    client, store, _ = serve()
    ids = [store.record("oomwatch", "recorded", None, {"n": n}, f"k{n}", summary=f"kill {n}")[0].id for n in range(5)]
    page = client.get("/incidents?limit=2", headers=AUTH).json()
    assert [i["id"] for i in page["incidents"]] == ids[::-1][:2]
    assert (page["total"], page["limit"], page["offset"], page["next_offset"]) == (5, 2, 0, 2)
    last = client.get("/incidents?limit=2&offset=4", headers=AUTH).json()
    assert [i["id"] for i in last["incidents"]] == [ids[0]] and last["next_offset"] is None
    html = client.get("/incidents?format=html&limit=2&offset=2", headers=AUTH).text
    assert '<p id="page">3–4 of 5 <a href="/incidents?format=html&amp;limit=2&amp;offset=4">next</a></p>' in html
    assert html.count("<tr><td>") == 2 and "kill 2" in html and "kill 1" in html
    for query, reason in (
        ("limit=0", f"limit is a whole number from 1 to {MAX_PAGE}"),
        (f"limit={MAX_PAGE + 1}", f"limit is a whole number from 1 to {MAX_PAGE}"),
        ("offset=-1", f"offset is a whole number from 0 to {1 << 62}"),
    ):
        r = client.get(f"/incidents?{query}", headers=AUTH)
        assert (r.status_code, r.json()) == (400, {"error": reason}), query


def test_a_kill_recorded_without_a_diagnosis_has_a_page_of_its_scene(serve):
    from memdiag.diagnose.serve.scene import explain

    client, store, _ = serve()
    t0, mib = 1_800_000_000.0, 1 << 20
    cg = [(t0 + 5 * i, {"usage": (10 + 5 * i) * mib, "limit": 64 * mib, "anon": (9 + 5 * i) * mib}) for i in range(11)]
    scene = explain(cg, [(t, {"rss": v["anon"]}) for t, v in cg], t0 + 52, 5.0, 64 * mib, victim_name="PID 7 (leak)")
    record = {"victim_pid": 7, "scene": scene.model_dump()}
    incident, _ = store.record("oomwatch", "recorded", None, record, "k1", summary="OOM killer killed PID 7 (leak)")
    r = client.get(f"/incidents/{incident.id}?format=html", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), r.text[:200]
    assert "OOM killer killed PID 7 (leak)" in r.text and '<div id="scene-chart">' in r.text
    assert scene.text.split(";")[0].replace("'", "&#x27;") in r.text
    r = client.get(f"/incidents/{incident.id}?format=md", headers=AUTH)  # no report: only the page
    assert r.status_code == 404


def test_one_incident_and_its_missing_report(serve):
    client, store, _ = serve()
    incident, _ = store.record("oomwatch", "recorded", None, {"n": 1}, "k1", summary="kill 1")
    r = client.get(f"/incidents/{incident.id}", headers=AUTH)
    assert r.status_code == 200 and r.json()["summary"] == "kill 1" and r.json()["state"] == "recorded"
    r = client.get(f"/incidents/{incident.id}?format=md", headers=AUTH)
    assert (r.status_code, r.json()) == (404, {"error": f"incident {incident.id} has no report (recorded)"})
    r = client.get(f"/incidents/{incident.id}?format=pdf", headers=AUTH)
    assert (r.status_code, r.json()) == (400, {"error": "format is md, json, html or pprof"})
    assert client.get("/incidents/not-an-id", headers=AUTH).json() == {"error": "no such incident"}
    assert client.get("/incidents/0123abcd", headers=AUTH).status_code == 404
    assert client.get("/nowhere").json() == {"error": "Not Found"}
    assert client.get("/diagnose").status_code == 405


def test_grafana_needs_its_signature_when_a_secret_is_set(serve, target):
    client, store, worker = serve(grafana_secret="hush", grafana_timestamp_header="X-Ts")
    body = json.dumps({"version": "1", "alerts": [_alert(target, "g1")]}).encode()
    good = hmac.new(b"hush", b"1700000000:" + body, hashlib.sha256).hexdigest()
    headers = {**AUTH, "Content-Type": "application/json", "X-Ts": "1700000000"}
    r = client.post("/alerts/grafana", content=body, headers={**headers, "X-Grafana-Alerting-Signature": "00" * 32})
    assert (r.status_code, r.json()) == (401, {"error": "bad X-Grafana-Alerting-Signature"})
    r = client.post("/alerts/grafana", content=body, headers={**headers, "X-Grafana-Alerting-Signature": good})
    assert r.status_code == 202 and r.json()["incidents"][0]["new"] is True
    assert [j.source for j in worker.queued] == ["grafana"]
    assert 'memdiag_alerts_received_total{source="grafana"} 1.0' in client.get("/metrics").text


def test_a_done_incident_serves_its_report_as_a_pprof_profile(serve, tmp_path):
    """format=pprof: the report's profile.pb.gz as it was written, bytes for go tool pprof."""
    client, store, _ = serve()
    incident, _ = store.record("alertmanager", "queued", None, {"n": 1}, "k1", summary="leak")
    files = render_all(fixture_report().model_copy(update={"folded_probe": "memleak"}))
    folder, _ = store.write_report(incident.id, files)
    store.settle(incident.id, state="done", report_dir=folder)
    r = client.get(f"/incidents/{incident.id}?format=pprof", headers=AUTH)
    assert (r.status_code, r.headers["content-type"]) == (200, "application/octet-stream")
    assert r.content == files["profile.pb.gz"]
    (tmp_path / "served.pb.gz").write_bytes(r.content)
    top = subprocess.run(
        ["go", "tool", "pprof", "-top", str(tmp_path / "served.pb.gz")], env=GO_ENV, capture_output=True, text=True
    )
    assert re.search(r"^ +24MB +100% +100% +24MB +100% +Orders::add$", top.stdout, re.M), top.stdout + top.stderr
    assert client.get(f"/incidents/{incident.id}?format=md", headers=AUTH).text == files["report.md"]
