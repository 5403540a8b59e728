"""Node agent mode against a real Alertmanager: two `memdiag serve --node` agents pull from one
Alertmanager, each takes only its own node's alerts (real workload pids), a silenced alert is
not taken, re-polling makes no second incident, an alert silenced while its diagnosis runs stops
nothing, and an Alertmanager that goes away and comes back shows in /healthz."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from conftest import TOKEN, Server, free_port, request
from kit import MEMDIAG

POLL = 1.0


class Alertmanager:
    """A real prometheus-alertmanager on a fixed loopback port, stoppable and restartable there;
    with `webhook`, it also sends node a's alerts to that URL (as per-node routes do)."""

    def __init__(self, tmp: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg = tmp / "am.yml"
        self.storage = tmp / "am-data"
        self.storage.mkdir()
        self.proc: subprocess.Popen | None = None

    def configure(self, webhook: str | None) -> None:
        text = 'route:\n  receiver: "null"\n'
        if webhook:
            text += (
                "  routes:\n    - matchers: ['node=\"a\"']\n      receiver: node-a\n      group_by: ['...']\n"
                "      group_wait: 0s\n      group_interval: 1s\n"
            )
        text += 'receivers:\n  - name: "null"\n'
        if webhook:
            text += (
                f"  - name: node-a\n    webhook_configs:\n      - url: {webhook}/alerts/alertmanager\n"
                f"        http_config:\n          authorization:\n            credentials: {TOKEN}\n"
            )
        self.cfg.write_text(text)

    def start(self) -> Alertmanager:
        if not self.cfg.exists():
            self.configure(None)
        self.proc = subprocess.Popen(
            [
                "prometheus-alertmanager",
                f"--config.file={self.cfg}",
                f"--storage.path={self.storage}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if request(self.url + "/-/ready", token=None, timeout=2)[0] == 200:
                    return self
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("alertmanager did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def post(self, path: str, payload) -> dict | list:
        status, raw = request(self.url + path, "POST", json.dumps(payload).encode(), token=None)
        assert status == 200, raw
        return json.loads(raw or b"null")

    def fire(self, **labels: str) -> None:
        self.post("/api/v2/alerts", [{"labels": labels, "annotations": {"summary": "test"}}])

    def silence(self, **labels: str) -> str:
        now = datetime.now(timezone.utc)
        body = {
            "matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in labels.items()],
            "startsAt": (now - timedelta(minutes=1)).isoformat(),
            "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "test_node_agent",
            "comment": "test",
        }
        return self.post("/api/v2/silences", body)["silenceID"]


@pytest.fixture
def alertmanager(root_required, tmp_path):
    am = Alertmanager(tmp_path)
    yield am
    am.stop()


@pytest.fixture
def agents(root_required, tmp_path, alertmanager):
    """agents("a", "b"): started agents pulling from `alertmanager` (started after them here, so
    node a's agent can also be its webhook receiver); all stopped at the end."""
    made: list[Server] = []

    def start(*nodes: str, webhook_a: bool = False, duration: float = 3) -> list[Server]:
        for node in nodes:
            extra = ["--node", node, "--alertmanager", alertmanager.url, "--poll", str(POLL), "--no-oom-watch"]
            made.append(Server(tmp_path / f"data-{node}", duration=duration, extra=extra))
        alertmanager.configure(made[0].url if webhook_a else None)
        alertmanager.start()
        return [s.start() for s in made]

    yield start
    for s in made:
        s.stop()


def _metric(srv: Server, name: str, labels: str) -> float:
    for line in srv.get("/metrics")[1].decode().splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.split()[-1])
    return 0.0


def _alerting(srv: Server, alertname: str) -> list[dict]:
    return [i for i in srv.incidents() if i["alert"] and i["alert"]["labels"].get("alertname") == alertname]


def _until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def test_two_agents_take_only_their_own_nodes_alerts(workload, alertmanager, agents):
    wa, wb = workload("leak", "256"), workload("leak", "256")
    a, b = agents("a", "b", webhook_a=True)
    quiet = alertmanager.silence(alertname="Quiet")
    run = uuid.uuid4().hex[:8]  # alertnames of this run only
    grow = f"Grow{run}"

    fired = time.monotonic()
    alertmanager.fire(alertname=grow, node="a", pid=str(wa.pid))
    alertmanager.fire(alertname=grow, node="b", pid=str(wb.pid))
    alertmanager.fire(alertname="Quiet", node="a", pid=str(wa.pid))
    exited = subprocess.Popen(["true"])
    exited.wait()
    alertmanager.fire(alertname=f"Gone{run}", node="a", pid=str(exited.pid))  # not on this host any more
    (ia,) = _until(lambda: _alerting(a, grow), 15, "agent a takes node a's alert")
    latency_a = time.monotonic() - fired
    (ib,) = _until(lambda: _alerting(b, grow), 15, "agent b takes node b's alert")
    latency_b = time.monotonic() - fired
    print(f"alert posted -> incident: a {latency_a:.2f} s (webhook, pull), b {latency_b:.2f} s (pull, --poll {POLL:g})")

    assert ia["source"] == "alertmanager" and ia["target"]["pid"] == wa.pid
    assert ia["alert"]["labels"]["node"] == "a" and ia["alert"]["endsAt"] == "0001-01-01T00:00:00Z"
    assert ib["target"]["pid"] == wb.pid and ib["alert"]["labels"]["node"] == "b"

    # node b's alert is silenced while its diagnosis runs: the diagnosis goes on, the record says why
    silence = alertmanager.silence(alertname=grow, node="b")
    gone = _until(
        lambda: [i for i in b.incidents() if i["state"] == "resolved"], 10, "agent b records the silenced alert"
    )
    assert f"silenced by {silence}" in gone[0]["summary"] and "continues" in gone[0]["summary"]
    assert gone[0]["alert"]["labels"] == {"alertname": grow, "node": "b", "pid": str(wb.pid)}
    done_b = b.wait(ib["id"], timeout=90)
    assert done_b["state"] == "done", done_b
    assert done_b["target"]["pid"] == wb.pid
    done_a = a.wait(ia["id"], timeout=90)
    assert done_a["state"] == "done", done_a

    # node a's alert also came by webhook (its route): the same key, so the same incident
    assert _metric(a, "memdiag_alerts_received_total", 'source="alertmanager"') >= 1
    assert _metric(a, "memdiag_alerts_received_total", 'source="alertmanager-pull"') >= 1
    assert _metric(a, "memdiag_alert_deliveries_total", 'outcome="duplicate"') >= 1

    # several polls later: still one incident per alert, the silenced alert never taken, nothing crossed
    time.sleep(3 * POLL)
    incidents_a, incidents_b = a.incidents(), b.incidents()
    assert [i["id"] for i in incidents_a] == [ia["id"]], incidents_a
    assert all(i["alert"]["labels"]["node"] == "b" for i in incidents_b), incidents_b
    assert not any(i["alert"]["labels"]["alertname"] == "Quiet" for i in incidents_a + incidents_b)
    assert quiet  # the silence Alertmanager made
    a.stop()
    log = a.proc.stderr.read()
    refused = [line for line in log.splitlines() if f"(Gone{run}) not taken" in line]
    # said once, not once per poll
    assert len(refused) == 1 and f"no process {exited.pid} on this host" in refused[0], log


def test_alertmanager_down_then_back_shows_in_healthz(alertmanager, agents):
    (agent,) = agents("a")
    assert request(agent.url + "/healthz")[0] == 200
    alertmanager.stop()
    stopped = time.monotonic()

    def unhealthy():
        status, raw = request(agent.url + "/healthz")
        return json.loads(raw) if status == 503 else None

    body = _until(unhealthy, 30, "/healthz turns 503 with Alertmanager stopped")
    print(f"Alertmanager stopped -> /healthz 503 in {time.monotonic() - stopped:.1f} s: {body['reason']}")
    assert f"Alertmanager {alertmanager.url} failing: cannot connect" in body["reason"]
    assert "polls in a row" in body["reason"]
    assert request(agent.url + "/healthz?scope=process")[0] == 200  # the liveness probe's: no restart for it

    alertmanager.start()
    back = time.monotonic()
    _until(lambda: request(agent.url + "/healthz")[0] == 200, 30, "/healthz healthy again")
    print(f"Alertmanager back -> /healthz 200 in {time.monotonic() - back:.1f} s")
    agent.stop()
    log = agent.proc.stderr.read()
    failing = [line for line in log.splitlines() if "failing" in line]
    assert len(failing) == 1, log  # one line for the change of state, not one per failed poll
    assert "answers again after" in log


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--node", "a"], "--node and --alertmanager go together"),
        (["--alertmanager", "http://127.0.0.1:9093"], "--node and --alertmanager go together"),
        (["--node", 'a"b', "--alertmanager", "http://127.0.0.1:9093"], "--node 'a\"b': expected a node name"),
        (["--node", "a", "--alertmanager", "ftp://x"], "--alertmanager ftp://x: expected http://HOST:PORT"),
        (["--node", "a", "--alertmanager", "http://h:99999"], "--alertmanager http://h:99999: Port out of range"),
        (["--node", "a", "--alertmanager", "http://u:p@h"], "no query, fragment or credentials"),
        (["--node", "a", "--alertmanager", "http://h", "--poll", "0"], "--poll: '0' is not a finite number"),
    ],
)
def test_bad_pull_options_are_one_line(tmp_path, args, message):
    r = subprocess.run([MEMDIAG, "serve", "--data", str(tmp_path / "d"), *args], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_alertmanager_errors_back_off_and_show_in_health(tmp_path):
    """The poller against a real HTTP server answering as a broken Alertmanager would: 5xx, a
    body that is not JSON, JSON that is not a list of alerts, no answer in time. None stops it;
    each counts as a failure with its own reason, the log says so once, and a good answer clears it."""
    import http.server
    import threading

    from memdiag.diagnose.serve.pull import FAILURES_UNHEALTHY, Poller

    status = {"state": "active", "silencedBy": [], "inhibitedBy": []}
    good = {"labels": {"node": "node-a", "pid": "1"}, "startsAt": "2026-01-01T00:00:00.000Z", "fingerprint": "f1"}
    big = {**good, "fingerprint": "f2", "labels": {f"l{i}": "x" for i in range(65)}}  # over 64 labels
    listing = json.dumps([{**good, "status": status}, {**big, "status": status}]).encode()
    answers = [(500, b"oops"), (200, b"not json"), (200, b'{"alerts": 1}'), ("slow", b"[]")]
    answers += [(200, listing), (200, listing)]
    paths: list[str] = []

    class Broken(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the standard library's name)
            paths.append(self.path)
            status, body = answers.pop(0)
            if status == "slow":
                time.sleep(1.5)
                status = 200
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(BrokenPipeError):  # the slow answer's reader has given up
                self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        logged: list[str] = []
        taken: list = []
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        poller = Poller(base, "node-a", None, 1.0, lambda alerts, **kw: taken.append(alerts), logged.append)
        poller.timeout = 0.5
        poller.thread.start = lambda: None  # polled by hand below; health() needs a live thread
        poller.thread = threading.current_thread()
        reasons, delays = [], []
        for _ in range(4):
            poller.poll_once()
            reasons.append(poller.reason)
            delays.append(poller.delay())
        assert reasons == [
            "HTTP 500 Internal Server Error",
            reasons[1],
            reasons[2],
            "no answer within 0.5 s",
        ], reasons
        assert reasons[1].startswith("not JSON: expected ident") and reasons[2].startswith("not a list of alerts: ")
        assert delays == [2.0, 4.0, 8.0, 16.0]  # doubling from --poll 1 ...
        poller.failures = 20
        assert poller.delay() == 60.0  # ... up to a minute
        poller.failures = 4
        assert FAILURES_UNHEALTHY <= 4 and f"Alertmanager {base} failing: no answer" in poller.health()
        assert len(logged) == 1 and logged[0].startswith(f"Alertmanager {base} failing: HTTP 500")
        poller.poll_once()
        assert poller.health() is None and poller.failures == 0
        assert logged[1] == f"Alertmanager {base} answers again after 4 failed polls"
        # one alert memdiag cannot take does not hold up the others; it is said once
        assert logged[2].startswith("alert f2 not taken: labels: ") and len(logged) == 3, logged
        assert [[(a.fingerprint, a.status, a.endsAt) for a in group] for group in taken] == [
            [("f1", "firing", "0001-01-01T00:00:00Z")]
        ]
        poller.poll_once()
        assert len(logged) == 3 and len(taken) == 1  # polled again: nothing new said, nothing taken again
        assert "filter=node%3D%22node-a%22" in paths[0] and "active=true" in paths[0]
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_alertmanager_token_file_checked_like_the_others(tmp_path):
    token = tmp_path / "am-token"
    token.write_text("secret\n")
    token.chmod(0o644)
    args = ["--node", "a", "--alertmanager", "http://127.0.0.1:9093", "--alertmanager-token-file", str(token)]
    r = subprocess.run([MEMDIAG, "serve", "--data", str(tmp_path / "d"), *args], capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"--alertmanager-token-file {token}: readable or writable by others (mode 644)" in r.stderr
