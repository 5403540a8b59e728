"""Untrusted input to `memdiag serve` is bounded before it is parsed: slow clients, JSON bombs,
hostile headers, loose types, oversized labels, cgroup paths outside the hierarchy, and the
server's own options and secret files. Real servers on loopback, real sockets, real files."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import TOKEN, Server, free_port, request
from flood import Flood, healthz_seconds

PLANTED = "987654321"  # a value no real cgroup file holds


def raw_request(port: int, head: bytes, body: bytes = b"", source: str = "127.0.0.1") -> bytes:
    """Send bytes a urllib request could not (non-ASCII headers); the whole answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as s:
        s.sendall(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return answer


@pytest.mark.alone  # a sub-second bound on this host's clock: the machine to itself
def test_slow_clients_neither_exhaust_descriptors_nor_slow_healthz(root_required, tmp_path):
    srv = Server(tmp_path / "data", extra=["--no-oom-watch"])
    srv.cmd = ["prlimit", "--nofile=1024:1024", *srv.cmd]  # a systemd unit's default: 1,100 clients would not fit
    srv.start()
    flood = None
    try:
        flood = Flood(srv.port, 1100, TOKEN)
        time.sleep(1)
        latencies = [healthz_seconds(srv.port, timeout=10) for _ in range(20)]
        assert max(latencies) < 0.5, latencies  # unbounded: /healthz never answered within 30 s
        assert flood.open_count() <= 512  # the cap on open connections, the rest closed at accept
        # every slow client is cut off: idle ones after 10 s, trickled bodies after 10 s of body
        deadline = time.monotonic() + 30
        while flood.open_count() and time.monotonic() < deadline:
            time.sleep(1)
        assert flood.open_count() == 0
        status, body = srv.post("/diagnose", {"pid": 4_000_000})
        assert status == 404 and "no such process" in body["error"]  # recovered: requests are answered
        assert srv.incidents() == []  # no trickled body became an incident
    finally:
        if flood is not None:
            flood.close()
        srv.stop()
    err = srv.proc.stderr.read()
    assert "Too many open files" not in err and "Traceback" not in err


def _json_answer(raw: bytes) -> tuple[int, dict]:
    """(status, JSON body) of one raw HTTP answer; AssertionError if it is not JSON."""
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), raw[:300]
    return int(head.split()[1]), json.loads(body)


def test_the_connection_cap_answers_with_a_json_reason_never_plain_text(root_required, tmp_path):
    """1,100 clients each holding a request (headers sent, body trickled) past the cap: uvicorn's own
    limit_concurrency answered 243 of them a plain-text "503 Service Unavailable" here, and ran the
    server out of descriptors (EMFILE in accept)."""
    srv = Server(tmp_path / "data", extra=["--no-oom-watch"])
    srv.cmd = ["prlimit", "--nofile=1024:1024", *srv.cmd]
    srv.start()
    flood, answers = None, []
    try:
        flood = Flood(srv.port, 1100, TOKEN, every_one_asks=True)
        with concurrent.futures.ThreadPoolExecutor(20) as pool:  # real clients meanwhile
            clients = list(pool.map(lambda _: srv.post("/diagnose", {"pid": 4_000_000}), range(40)))
        deadline = time.monotonic() + 40
        while flood.open_count() and time.monotonic() < deadline:
            time.sleep(1)
        assert flood.open_count() == 0
        answers = [_json_answer(a) for a in flood.answers.values()]
    finally:
        if flood is not None:
            flood.close()
        srv.stop()
    statuses = collections.Counter(status for status, _ in answers)
    print(f"1,100 held requests answered: {dict(statuses)}; {1100 - len(answers)} closed without an answer")
    assert set(statuses) <= {400, 408, 503}, statuses  # 400: a trickled byte before the headers went
    cap = [body["error"] for status, body in answers if status == 503]
    assert cap and all(e.startswith("too many open connections (at most ") for e in cap), cap[:3]
    assert len(answers) >= 1000  # a held request is told why it ends, not just cut off
    for status, body in clients:  # each a JSON answer: no such process, or the cap's own reason
        assert (status, "no such process" in body.get("error", "")) == (404, True) or (
            status == 503 and body["error"].startswith("too many open connections")
        ), (status, body)
    err = srv.proc.stderr.read()
    assert "Exceeded concurrency limit" not in err and "Too many open files" not in err and "Traceback" not in err


@pytest.fixture
def guarded(root_required, tmp_path):
    secret = tmp_path / "grafana-secret"
    secret.write_text("hush\n")
    secret.chmod(0o600)
    srv = Server(tmp_path / "data", extra=["--no-oom-watch", "--grafana-secret-file", str(secret)]).start()
    try:
        yield srv
    finally:
        srv.stop()


def test_bombs_hostile_headers_and_loose_types_are_4xx_and_store_nothing(guarded):
    srv = guarded
    status, body = srv.post("/alerts/alertmanager", b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nested deeper than 16 levels" in body["error"]
    nested: list = []
    for _ in range(20):
        nested = [nested]
    status, body = srv.post("/diagnose", {"alerts": [{"status": "firing", "labels": {}, "x": nested}]})
    assert status == 400 and "nested deeper than 16 levels" in body["error"]
    status, body = srv.post("/diagnose", b'{"pid": NaN}')
    assert status == 400 and body["error"].startswith("malformed JSON")
    status, body = srv.post("/diagnose", b'{"cgroup": "\\ud800"}')  # a lone surrogate
    assert status == 400 and body["error"].startswith("malformed JSON")

    for value in (True, 1.0, "1", [1], {"a": 1}, 0, -1, 2**70):
        status, body = srv.post("/diagnose", {"pid": value})
        assert status == 422 and body["error"].startswith("wrong payload shape: pid"), (value, body)
    for duration in (True, "5", 0, -1, 601, 1e308 * 10):
        status, body = srv.post("/diagnose", {"pid": 1, "duration": duration})
        assert status in (400, 422), (duration, body)

    post = b"POST /alerts/grafana HTTP/1.1\r\nHost: x\r\n"
    alert = json.dumps({"alerts": [{"status": "firing", "labels": {"pid": "1"}}]}).encode()
    answer = raw_request(srv.port, post + "Authorization: Bearer é€\r\n".encode(), alert)
    assert answer.startswith(b"HTTP/1.1 401") and b"bearer token" in answer
    answer = raw_request(srv.port, post + b"Authorization: Bearer \xff\xfe\r\n", alert)
    assert answer.startswith(b"HTTP/1.1 401")
    auth = f"Authorization: Bearer {TOKEN}\r\n".encode()
    for signature in ("é" * 64, "zz" * 32, "00" * 31, "\u00ff" * 64):
        head = post + auth + b"X-Grafana-Alerting-Signature: " + signature.encode("latin-1") + b"\r\n"
        answer = raw_request(srv.port, head, alert)
        assert answer.startswith(b"HTTP/1.1 401") and b"Signature" in answer, (signature, answer[:200])

    labels = {f"l{i}": "v" for i in range(65)}
    status, body = srv.post("/alerts/alertmanager", {"alerts": [{"status": "firing", "labels": labels}]})
    assert status == 422 and "at most 64 items" in body["error"]
    status, body = srv.post("/alerts/alertmanager", {"alerts": [{"status": "firing", "labels": {"pid": "1" * 2000}}]})
    assert status == 422 and "at most 1024 characters" in body["error"]
    big = {f"a{i}": "x" * 8000 for i in range(5)}
    status, body = srv.post(
        "/alerts/alertmanager", {"alerts": [{"status": "resolved", "labels": {"pid": "1"}, "annotations": big}]}
    )
    assert status == 422 and "exceed 32768 characters" in body["error"]
    # found by the fuzz: a name longer than the kernel's 255 (ENAMETOOLONG) is no cgroup, an empty uid
    # beside pod_uid is a bad label, and a trailing newline is not part of a valid pid
    status, body = srv.post("/diagnose", {"cgroup": "x" * 300})
    assert status == 404 and "is not a memory cgroup" in body["error"], body
    firing = [{"status": "firing", "labels": {"uid": "", "pod_uid": "x"}}]
    status, body = srv.post("/alerts/alertmanager", {"alerts": firing})
    assert status == 422 and "not a pod uid" in body["error"], body
    firing = [{"status": "firing", "labels": {"pid": f"{os.getpid()}\n"}}]
    status, body = srv.post("/alerts/alertmanager", {"alerts": firing})
    assert status == 422 and "not a process id" in body["error"], body
    assert srv.incidents() == []


def test_failed_authentications_are_limited_but_not_the_right_token(guarded):
    srv = guarded
    statuses = [srv.post("/diagnose", {"pid": 4_000_000}, token="wrong")[0] for _ in range(30)]
    assert statuses[0] == 401 and statuses[-1] == 429
    # the same address with the right token is served at once: only failures were counted
    for _ in range(40):
        status, body = srv.post("/diagnose", {"pid": 4_000_000})
        assert status == 404 and "no such process" in body["error"]
    assert request(srv.url + "/healthz", token=None)[0] == 200
    # a wrong Grafana signature is a failed authentication too (from another address: this one is spent)
    alert = json.dumps({"alerts": [{"status": "firing", "labels": {"pid": "4000000"}}]}).encode()
    head = b"POST /alerts/grafana HTTP/1.1\r\nHost: x\r\n" + f"Authorization: Bearer {TOKEN}\r\n".encode()
    head += b"X-Grafana-Alerting-Signature: " + b"00" * 32 + b"\r\n"
    answers = [raw_request(srv.port, head, alert, source="127.0.0.2")[:12] for _ in range(30)]
    assert answers[0] == b"HTTP/1.1 401" and answers[-1] == b"HTTP/1.1 429"


@pytest.fixture
def planted():
    """A folder outside the cgroup tree dressed as a memory cgroup, with values no cgroup has."""
    root = Path(tempfile.mkdtemp(prefix="memdiag-plant-", dir="/tmp"))
    try:
        fake = root / "x"
        fake.mkdir()
        for name in ("memory.current", "memory.max", "memory.limit_in_bytes", "memory.usage_in_bytes"):
            (fake / name).write_text(PLANTED + "\n")
        (fake / "memory.stat").write_text(f"anon {PLANTED}\nfile {PLANTED}\n")
        (fake / "cgroup.procs").write_text(f"{os.getpid()}\n")
        yield fake
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_cgroup_paths_outside_the_hierarchy_are_refused_and_never_read(guarded, planted, memdiag):
    srv = guarded
    up = "../" * 8 + str(planted).lstrip("/")
    for cgroup in (up, "/" + up, "./" + up, "/sys/fs/cgroup/../../" + str(planted).lstrip("/")):
        status, body = srv.post("/diagnose", {"cgroup": cgroup})
        assert status in (404, 422) and PLANTED not in json.dumps(body), (cgroup, body)
    for labels in ({"id": "/" + up}, {"id": "/sys/fs/cgroup/../.." + str(planted)}):
        status, body = srv.post("/alerts/alertmanager", {"alerts": [{"status": "firing", "labels": labels}]})
        assert status in (404, 422), (labels, body)
    assert srv.incidents() == []
    for arg in (up, "/sys/fs/cgroup/../.." + str(planted)):
        r = memdiag("--cgroup", arg, "--duration", "1")
        assert r.returncode == 2, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "--cgroup:" in r.stderr, r.stderr
        assert PLANTED not in r.stdout + r.stderr


def test_cgroup_target_keeps_real_cgroups_and_refuses_dot_dot(planted, memcg):
    from memdiag.diagnose.errors import UsageError
    from memdiag.diagnose.target import cgroup_target

    cg = memcg(64 << 20)
    t = cgroup_target(cg.path.lstrip("/"))
    assert t.cgroup.path == cg.path and t.cgroup.fs_path == str(cg.fs_path)
    with pytest.raises(UsageError, match="outside the cgroup hierarchy mounted at"):
        cgroup_target("../" * 8 + str(planted).lstrip("/"))
    with pytest.raises(UsageError, match="outside the cgroup hierarchy"):
        cgroup_target(f"{cg.fs_path}" + "/.." * 8 + str(planted))
    # a real cgroup named through '..' is refused too: cgroupfs has no reason for it
    with pytest.raises(UsageError, match="goes through '..' or a symlink"):
        cgroup_target(f"{cg.path.lstrip('/')}/../{cg.path.lstrip('/')}")


def _secret(tmp: Path, name: str, mode: int = 0o600, text: str = "s3cret") -> Path:
    path = tmp / name
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def test_serve_options_and_secret_files_are_one_line_exit_2(memdiag, root_required, tmp_path):
    token = _secret(tmp_path, "token")
    loose = _secret(tmp_path, "loose", 0o644)
    group = _secret(tmp_path, "group", 0o640)
    other = _secret(tmp_path, "other")
    os.chown(other, 65534, 65534)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    empty = _secret(tmp_path, "empty", text="")
    spaced = _secret(tmp_path, "spaced", text="two words")
    base = ["serve", "--no-oom-watch", "--data", str(tmp_path / "data"), "--listen", f"127.0.0.1:{free_port()}"]
    cases = [
        (["--queue", "0"], "--queue: '0' is not a whole number at least 1 and at most 10000"),
        (["--queue", "1000000"], "at most 10000"),
        (["--queue", "x"], "'x' is not a whole number"),
        (["--duration", "nan"], "--duration: 'nan' is not a finite number more than 0 and at most 3600 seconds"),
        (["--duration", "inf"], "more than 0 and at most 3600 seconds"),
        (["--duration", "0"], "more than 0 and at most 3600 seconds"),
        (["--duration", "-1"], "more than 0 and at most 3600 seconds"),
        (["--duration", "3601"], "more than 0 and at most 3600 seconds"),
        (["--budget", "-5"], "--budget: '-5' is not a finite number more than 0 and at most 100 percent"),
        (["--budget", "nan"], "more than 0 and at most 100 percent"),
        (["--budget", "101"], "more than 0 and at most 100 percent"),
        (["--max-attempts", "0"], "--max-attempts: '0' is not a whole number at least 1"),
        (["--dedupe-window", "nan"], "--dedupe-window: 'nan' is not a finite number more than 0 and at most 31536000"),
        (["--token-file", str(loose)], f"readable or writable by others (mode 644): run chmod 600 {loose}"),
        (["--read-token-file", str(group)], "run chmod 600"),
        (["--grafana-secret-file", str(loose)], "--grafana-secret-file"),
        (["--token-file", str(other)], "owned by uid 65534"),
        (["--token-file", str(fifo)], "not a regular file"),
        (["--token-file", str(tmp_path)], "not a regular file"),
        (["--token-file", str(empty)], "empty"),
        (["--token-file", str(spaced)], "printable ASCII"),
        (["--token-file", str(tmp_path / "missing")], "cannot read"),
    ]
    for extra, expected in cases:
        r = memdiag(*base, *extra, timeout=30)
        assert r.returncode == 2, (extra, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and expected in r.stderr, (extra, r.stderr)
        assert "listening on" not in r.stdout
    assert not (tmp_path / "data").exists()  # refused before anything was made
    assert token.exists()


def test_port_in_use_is_one_line_and_never_says_listening(memdiag, root_required, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = memdiag("serve", "--no-oom-watch", "--data", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}")
    assert r.returncode == 2 and "listening on" not in r.stdout
    assert r.stderr.strip() == f"memdiag: --listen 127.0.0.1:{port}: cannot listen there (Address already in use)"


def test_listening_is_printed_once_the_socket_answers(root_required, tmp_path):
    port = free_port()
    proc = subprocess.Popen(
        [Server(tmp_path / "d").cmd[0], "serve", "--no-oom-watch", "--data", str(tmp_path / "data"),
         "--listen", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"memdiag serve: listening on http://127.0.0.1:{port}")
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # bound and listening when the line was printed
        assert healthz_seconds(port, timeout=30) < 30
    finally:
        proc.terminate()
        proc.wait(30)
