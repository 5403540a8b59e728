"""A real `memdiag serve` on a loopback port of its own, and a real Alertmanager in front of it."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kit import MEMDIAG

TOKEN = "test-token-4f1c9a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    token: str | None = TOKEN,
    headers: dict | None = None,
    timeout: float = 30,
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Server:
    def __init__(self, data: Path, duration: float = 14, extra: list[str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data = data
        self.token_file = data.parent / f"token-{self.port}"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.cmd = [
            MEMDIAG,
            "serve",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--token-file",
            str(self.token_file),
            "--data",
            str(data),
            "--duration",
            str(duration),
            *(extra or []),
        ]
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if request(self.url + "/healthz", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"memdiag serve exited: {self.proc.stderr.read()}")
            time.sleep(0.3)
        raise RuntimeError("memdiag serve did not come up")

    def health(self) -> dict:
        return json.loads(request(self.url + "/healthz", token=None)[1])

    def oom_watch_attached(self, timeout: float = 60) -> None:
        """Wait for /healthz to say the OOM watch is attached (it compiles and loads after the
        server answers); AssertionError with what it says instead at the timeout."""
        deadline = time.monotonic() + timeout
        while (state := self.health()["oom_watch"]) == "starting" and time.monotonic() < deadline:
            time.sleep(0.2)
        assert state == "attached", f"OOM watch: {state}"

    def stop(self, kill: bool = False) -> None:
        if self.proc and self.proc.poll() is None:
            (self.proc.kill if kill else self.proc.terminate)()
            self.proc.wait(30)

    def post(self, path: str, payload, token: str | None = TOKEN, **kw) -> tuple[int, dict]:
        body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        status, raw = request(self.url + path, "POST", body, token=token, **kw)
        return status, json.loads(raw or b"{}")

    def get(self, path: str) -> tuple[int, bytes]:
        return request(self.url + path)

    def incidents(self) -> list[dict]:
        return json.loads(self.get("/incidents")[1])["incidents"]

    def kill_incident(self, host_pid: int, timeout: float = 30) -> dict:
        """The OOM watch's incident of the kill of host_pid (other tests may kill at the same time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [
                i for i in self.incidents() if i["source"] == "oomwatch" and i["alert"]["victim_host_pid"] == host_pid
            ]
            if found:
                (incident,) = found
                return incident
            time.sleep(0.5)
        raise AssertionError(f"no OOM incident for host PID {host_pid}: {self.incidents()}")

    def wait(self, iid: str, states=("done", "failed"), timeout: float = 120) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            item = json.loads(self.get(f"/incidents/{iid}")[1])
            if item["state"] in states:
                return item
            time.sleep(0.5)
        raise AssertionError(f"incident {iid} never reached {states}")


@pytest.fixture
def server(root_required, tmp_path):
    started: list[Server] = []

    def start(**kw) -> Server:
        s = Server(tmp_path / "data", **kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


@pytest.fixture
def sleeper():
    """start() -> the pid of a new `sleep 600`, a target of our own; all killed at the end."""
    procs: list[subprocess.Popen] = []

    def start() -> int:
        procs.append(subprocess.Popen(["sleep", "600"]))
        return procs[-1].pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def servers(root_required):
    """Servers on any folder, each killed at the end."""
    started: list[Server] = []

    def start(data: Path, duration: float = 2, extra: list[str] | None = None) -> Server:
        # no OOM watch: kills elsewhere on the host would add incidents (and diagnoses) of their own
        s = Server(data, duration=duration, extra=["--no-oom-watch", *(extra or [])])
        started.append(s)
        return s.start()

    yield start
    for s in started:
        s.stop(kill=True)


@pytest.fixture
def alertmanager(root_required, tmp_path):
    procs = []

    def start(receiver_url: str, repeat_interval: str = "1h", config: str | None = None) -> str:
        """Its URL. config: a whole configuration instead (e.g. the shipped receiver, tests/loop.py)."""
        port = free_port()
        cfg = tmp_path / f"am-{port}.yml"
        cfg.write_text(
            config
            or "route:\n  receiver: memdiag\n  group_by: ['alertname', 'pid']\n  group_wait: 1s\n"
            f"  group_interval: 5s\n  repeat_interval: {repeat_interval}\n"
            "receivers:\n  - name: memdiag\n    webhook_configs:\n"
            f"      - url: {receiver_url}\n        send_resolved: true\n"
            f"        http_config:\n          authorization:\n            type: Bearer\n"
            f"            credentials: {TOKEN}\n"
        )
        storage = tmp_path / f"am-data-{port}"
        storage.mkdir()
        proc = subprocess.Popen(
            [
                "prometheus-alertmanager",
                f"--config.file={cfg}",
                f"--storage.path={storage}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if request(url + "/-/ready", token=None, timeout=2)[0] == 200:
                    return url
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"alertmanager did not start: {proc.stderr.read() if proc.poll() is not None else ''}")

    yield start
    for p in procs:
        p.terminate()
        p.wait(30)
