"""Memory no heap holds, judged on the distribution's own servers on the real kernel, as a new user
would run memdiag on them: PostgreSQL bulk-loading inside a limited memory cgroup (page cache at
the limit: cache, not a leak nor pressure), and redis-server whose clients open connections and
keep them (descriptors that only climb, opened by redis's accept path).

Each server is our own throwaway instance (a temp dir, a unix socket or a loopback port, nothing
saved), never the distribution's service; a test skips, saying which, when the server is not
installed (scripts/setup.sh does not install them: apt-get install -y postgresql redis-server)."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kit import MemoryCgroup, wait_until
from memdiag.diagnose.culprit import split_frame

MiB = 1 << 20


def _diagnose(memdiag, out: Path, *args: str) -> tuple[str, dict]:
    """memdiag's CLI for a 20 s window: (the verdict line it printed first, report.json)."""
    r = memdiag(*args, "--duration", "20", "--output", str(out), timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return r.stdout.splitlines()[0], json.loads((out / "report.json").read_text())


def _rule(rep: dict, name: str) -> dict:
    return next(t for t in rep["trail"] if t["kind"] == "rule" and t["name"] == name)


def _stop(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- PostgreSQL: a bulk load in a 256 MiB cgroup ----------------------------------------------------


@contextlib.contextmanager
def _postgres(cgroup: MemoryCgroup) -> Iterator[list[str]]:
    """A throwaway cluster (initdb in a temp dir, unix socket there, no TCP, shared_buffers 16MB)
    whose postmaster, and so every backend it forks, runs in the cgroup. Yields psql's command line;
    the server is stopped and the directory removed on the way out, also when the test fails."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"), key=lambda p: int(Path(p).parts[-3]))
    if not bins:
        pytest.skip("needs PostgreSQL (apt-get install -y postgresql): no /usr/lib/postgresql/*/bin/postgres")
    try:
        owner = pwd.getpwnam("postgres")  # the server refuses to run as root
    except KeyError:
        pytest.skip("needs the postgres user that Debian's postgresql package makes")
    bindir = Path(bins[-1]).parent
    top = Path(tempfile.mkdtemp(prefix="memdiag-pg-"))  # tmp_path's parents are root's 0700
    os.chown(top, owner.pw_uid, owner.pw_gid)
    procs = str(cgroup.procs_file)

    def as_postgres() -> None:
        os.setgroups([])
        os.setgid(owner.pw_gid)
        os.setuid(owner.pw_uid)

    def into_cgroup_as_postgres() -> None:  # in the child, before exec: join as root, then drop
        with open(procs, "w") as f:
            f.write(str(os.getpid()))
        as_postgres()

    server = None
    try:
        subprocess.run(
            [bindir / "initdb", "-D", top / "data", "-A", "trust", "-U", "postgres", "--no-sync"],
            preexec_fn=as_postgres, cwd=top, check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        settings = {"listen_addresses": "", "unix_socket_directories": str(top), "shared_buffers": "16MB"}
        settings |= {"fsync": "off", "synchronous_commit": "off"}  # throwaway: nothing to keep
        server = subprocess.Popen(
            [bindir / "postgres", "-D", top / "data", *(a for k, v in settings.items() for a in ("-c", f"{k}={v}"))],
            preexec_fn=into_cgroup_as_postgres, cwd=top, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        ready = [bindir / "pg_isready", "-q", "-h", top]
        wait_until(lambda: subprocess.run(ready).returncode == 0, "postgres accepting connections", timeout=30)
        yield [str(bindir / "psql"), "-h", str(top), "-U", "postgres", "-q", "-v", "ON_ERROR_STOP=1", "-c"]
    finally:
        if server is not None:
            _stop(server, signal.SIGQUIT)  # immediate shutdown; the cgroup's teardown kills stragglers
        shutil.rmtree(top, ignore_errors=True)


class _BulkLoad(threading.Thread):
    """INSERT ... SELECT generate_series in a loop, ~50 MB a statement, into two tables in turn: a
    table takes 1 GiB (four times the limit) before the load moves to the other, emptied first."""

    def __init__(self, psql: list[str]):
        super().__init__(daemon=True)
        self.psql, self.stop, self.batches, self.error = psql, threading.Event(), 0, None
        for t in ("load_a", "load_b"):
            subprocess.run([*psql, f"CREATE TABLE {t} (id int, pad text)"], check=True, timeout=30)

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                table = ("load_a", "load_b")[self.batches // 20 % 2]
                sql = f"INSERT INTO {table} SELECT g, repeat('x', 200) FROM generate_series(1, 200000) g"
                if self.batches % 20 == 0:
                    sql = f"TRUNCATE {table}; {sql}"
                subprocess.run([*self.psql, sql], check=True, capture_output=True, timeout=60)
                self.batches += 1
        except Exception as e:  # noqa: BLE001  # said by the test, not lost in a thread
            self.error = e


def test_postgres_bulk_load_at_a_cgroup_limit_is_page_cache(memdiag, memcg, tmp_path):
    cg = memcg(256 * MiB)
    usage = cg.fs_path / "memory.usage_in_bytes"
    with _postgres(cg) as psql:
        load = _BulkLoad(psql)
        load.start()
        try:
            wait_until(lambda: int(usage.read_text()) > 0.95 * cg.limit and cg.limit_hits() > 0, "cgroup at its limit")
            line, rep = _diagnose(memdiag, tmp_path, "--cgroup", cg.path)
        finally:
            load.stop.set()
            load.join(60)
        assert load.error is None, load.error
        assert load.batches * 200_000 * 240 > 4 * cg.limit  # the load wrote several times the limit
        backends = len(cg.pids())
    assert backends >= 5  # postmaster, checkpointer, walwriter, ... : the forks stayed in the cgroup
    ledger = next(le for le in rep["counters"]["ledgers"] if le["scope"] == "cgroup")
    rows = {r["key"]: r for r in ledger["rows"]}
    ws = rows["working_set"]
    v = rep["verdict"]
    assert line.startswith(f"cache: cgroup {cg.path} (v{cg.version}): its cgroup uses "), line
    assert (v["kind"], v["rule"]) == ("cache", "page-cache-at-limit"), v["summary"]
    assert v["culprit"]["cgroup"] == cg.path and rep["target"]["cgroup"] == cg.path
    assert "inactive page cache that the kernel reclaims" in v["summary"]
    assert "Page cache at the limit: not a leak, not pressure" in v["summary"]
    for rule in ("cgroup-refaults", "cgroup-psi-stall"):  # the working set fits: no pressure of its own
        assert _rule(rep, rule)["state"] == "not-fired", _rule(rep, rule)
    assert _rule(rep, "cgroup-at-limit")["state"] == "fired"
    # the cgroup's ledger: usage split into lines that sum to it, the inactive page cache the largest
    assert ledger["subject"] == f"cgroup {cg.path}"
    summed = [r for r in ledger["rows"] if r["summed"]]
    assert sum(r["last"] for r in summed) == ledger["total_last"]
    assert max(summed, key=lambda r: r["last"])["key"] == "file_inactive"
    assert rows["file_inactive"]["last"] > 0.6 * ledger["total_last"]
    assert ledger["total_last"] > 0.9 * cg.limit
    assert not ws["summed"] and ws["last"] < 0.4 * cg.limit, ws
    assert abs(rows["residual"]["last"]) < 8 * MiB


# --- redis-server: clients that connect and never hang up ------------------------------------------


@contextlib.contextmanager
def _redis() -> Iterator[tuple[subprocess.Popen, int]]:
    """Our own redis-server on a free loopback port, nothing saved (--save '' --appendonly no), its
    directory a temp one; the distribution's service, running or not, is left as it is."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs redis-server (apt-get install -y redis-server)")
    top = Path(tempfile.mkdtemp(prefix="memdiag-redis-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = None
    try:
        server = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", str(top), "--logfile", ""],
            cwd=top, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

        def answers() -> bool:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                c.sendall(b"PING\r\n")
                return c.recv(16) == b"+PONG\r\n"
            return False

        wait_until(answers, "redis-server answering PING", timeout=30)
        yield server, port
    finally:
        if server is not None:
            _stop(server, signal.SIGTERM)
        shutil.rmtree(top, ignore_errors=True)


class _Hoarder(threading.Thread):
    """A client that opens 20 connections a second, PINGs on each and keeps them all open."""

    def __init__(self, port: int, per_second: float = 20):
        super().__init__(daemon=True)
        self.port, self.period, self.stop, self.held, self.error = port, 1 / per_second, threading.Event(), [], None

    def run(self) -> None:
        try:
            while not self.stop.wait(self.period):
                c = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                self.held.append(c)
                c.sendall(b"PING\r\n")
                assert c.recv(16) == b"+PONG\r\n"
        except Exception as e:  # noqa: BLE001
            self.error = e

    def close(self) -> None:
        self.stop.set()
        self.join(10)
        for c in self.held:
            c.close()


def test_redis_connections_held_by_clients_are_descriptors_from_its_accept_path(memdiag, root_required, tmp_path):
    with _redis() as (server, port):
        client = _Hoarder(port)
        client.start()
        try:
            time.sleep(2)  # connections already climbing when the window opens
            line, rep = _diagnose(memdiag, tmp_path, "--pid", str(server.pid))
            held = len(client.held)
        finally:
            client.close()
        assert client.error is None, client.error
    assert rep["target"]["pid"] == server.pid
    # the process ledger counts its descriptors by type: the sockets are what climbed
    ledger = next(le for le in rep["counters"]["ledgers"] if le["scope"] == "process")
    first, last = ledger["counts_first"], ledger["counts_last"]
    assert last["socket"] - first["socket"] >= 300 and last["socket"] <= held + 10  # 20/s over 20 s
    assert all(last.get(k, 0) - n <= 2 for k, n in first.items() if k not in ("socket", "total")), (first, last)
    acc = _rule(rep, "descriptors-accumulate")
    assert acc["state"] == "fired" and "ledger.process.fds_shape = climbing" in acc["reason"], acc
    # fdstack, asked by it, names the code that opened the ones still open: redis's accept path
    fdstack = next(p for p in rep["probes"] if p["name"] == "fdstack")
    assert fdstack["status"] == "ok" and "asked by descriptors-accumulate" in next(
        t["reason"] for t in rep["trail"] if t["kind"] == "probe" and t["name"] == "fdstack"
    )
    fig = fdstack["figures"]
    assert fig["fdstack.closed"] == 0 and fig["fdstack.outstanding"] == fig["fdstack.top_outstanding"] >= 100, fig
    stack = next(s for s in rep["stacks"] if s["probe"] == "fdstack")
    functions = [split_frame(f)[0] for f in stack["frames"]]
    assert functions[:3] == ["accept4", "anetTcpAccept", "acceptTcpHandler"], stack["frames"]
    assert stack["detail"].startswith(f"{int(fig['fdstack.top_outstanding'])} accepted descriptors still open")
    at_stack = _rule(rep, "descriptors-leak-at-stack")
    assert at_stack["state"] == "fired" and "fdstack.top_function = anetTcpAccept" in at_stack["reason"], at_stack
    v = rep["verdict"]
    # every peer still connected: held for its clients, not forgotten (growth, not a leak), and named
    # above the heap cache memleak finds in the per-client query buffers (_sdsMakeRoomFor)
    assert (v["kind"], v["rule"]) == ("growth", "descriptors-held-by-peers"), line
    assert line.startswith(f"{v['kind']}: PID {server.pid} (redis-server)"), line
    assert "anetTcpAccept accepted" in v["summary"] and "none of its" in v["summary"]
