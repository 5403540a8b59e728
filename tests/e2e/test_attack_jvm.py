"""The JVM path against a hostile target (issue 42): a JDK of nobody's whose bin/jfr is a script, a
JDK `release` file that is a link to /dev/zero or to a host file, or a FIFO, a crafted hsperfdata
file, an attach socket that never stops answering, and the recordings a killed memdiag left. Each
asserts what memdiag does instead (never runs the script, never reads past its bound, never the
host's file, within a stated time and memory), on real files, sockets, processes and one real JVM."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import struct
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memdiag.probes.jvm import jfr as jfrmod
from memdiag.probes.jvm.attach import MAX_REPLY_BYTES, AttachRefused, Jvm, describe_target, jcmd, jvm_tmp
from memdiag.probes.jvm.jfr import Recording, clean_stale
from memdiag.probes.jvm.tool import NO_TRUSTED_JFR, run_confined, trusted_jfr
from memdiag.system.hsperfdata import parse_perfdata, read_perfdata
from memdiag.system.jvm import jvm_counters
from memdiag.system.runtime import jvm_version

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "unit"))
from test_hsperfdata import perfdata  # noqa: E402

# its JVMs' recording and histogram costs are measured and kept (probes/jvm/costs.py): run alone
pytestmark = pytest.mark.alone

NOBODY = 65534
JDK17 = Path("/usr/lib/jvm/java-17-openjdk-amd64")
MARKER = "MARKER-1234"
# What one hostile input may cost memdiag here: the bounds the readers state, with room
MAX_SECONDS = 2.0
MAX_PEAK = 32 << 20


@contextlib.contextmanager
def measured():
    """(seconds, peak bytes allocated by Python) of the block, in a dict filled at its end."""
    out: dict = {}
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        yield out
    finally:
        out["seconds"] = time.monotonic() - t0
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def _fake_jdk_tree(home: Path) -> None:
    """The real JDK's files as another's JDK: the launcher, libjli.so and libjvm.so copied (the
    launcher and HotSpot find their home from their own files' real paths, so a JVM started from
    bin/java has this tree as its /proc/PID/exe and its java.home), the rest linked (24 MB)."""
    (home / "bin").mkdir()
    (home / "lib" / "server").mkdir(parents=True)
    shutil.copy2(JDK17 / "bin" / "java", home / "bin" / "java")
    for own in ("libjli.so", "server/libjvm.so"):
        shutil.copy2(JDK17 / "lib" / own, home / "lib" / own)
    for folder in ("lib", "lib/server"):
        for entry in (JDK17 / folder).iterdir():
            if not (home / folder / entry.name).exists():
                (home / folder / entry.name).symlink_to(entry)
    for part in ("conf", "release"):
        (home / part).symlink_to(JDK17 / part)


@pytest.fixture
def fake_jdk():
    """A JDK tree owned by nobody (as any user may unpack one), whose bin/jfr is a script that
    leaves a marker file. In /tmp (nobody must reach it), removed at the end."""
    home = Path(tempfile.mkdtemp(prefix="memdiag-fakejdk-"))
    marker = Path(tempfile.gettempdir()) / f"{MARKER}-{home.name}-jfr-ran"
    try:
        home.chmod(0o755)
        _fake_jdk_tree(home)
        script = home / "bin" / "jfr"
        script.write_text(f"#!/bin/sh\nid > {marker}\necho '{{}}'\n")
        script.chmod(0o755)
        for p in [home, *home.rglob("*")]:
            os.lchown(p, NOBODY, NOBODY)
        yield home, marker
    finally:
        shutil.rmtree(home, ignore_errors=True)
        marker.unlink(missing_ok=True)


# --- 1. never a file the target chose ---------------------------------------------------------------


def test_a_jdk_of_nobodys_jfr_is_refused_as_memdiags_tool_and_never_run(fake_jdk, tmp_path):
    home, marker = fake_jdk
    tool, why = trusted_jfr(environ={"MEMDIAG_JFR": str(home / "bin" / "jfr")})
    assert tool is None and f"belongs to uid {NOBODY}, not root" in why and "is not run" in why
    jdks = tmp_path / "jvm"
    jdks.mkdir()
    (jdks / "evil").symlink_to(home)
    tool, why = trusted_jfr(17, environ={}, jdks=jdks)
    assert tool is None and why.startswith(NO_TRUSTED_JFR) and "uid 65534" in why
    # a root-owned JDK with a folder others may write is refused too (its tool could be swapped)
    rooted = tmp_path / "rooted"
    shutil.copytree(home, rooted, symlinks=True)
    for p in [rooted, *rooted.rglob("*")]:
        os.lchown(p, 0, 0)
    tool, why = trusted_jfr(environ={"MEMDIAG_JFR": str(rooted / "bin" / "jfr")})
    assert tool is None and "writable by its group or by all" in why  # pytest's tmp_path is 0700, /tmp 1777
    assert not marker.exists()


def test_the_hosts_jdks_are_chosen_by_feature_version_and_the_target_has_no_say(tmp_path):
    tool, how = trusted_jfr(17, environ={})
    assert tool is not None and tool.path == str(JDK17 / "bin" / "jfr") and tool.feature == 17, how
    newest, how = trusted_jfr(None, environ={})
    assert newest is not None and newest.feature >= 17 and "/usr/lib/jvm/" in newest.path, how
    later, how = trusted_jfr(18, environ={})  # Temurin 25 here: the lowest at least the target's
    assert later is not None and (later.feature or 0) >= 18 or newest.feature == 17, how
    none, how = trusted_jfr(17, environ={}, jdks=tmp_path)
    assert none is None and how == NO_TRUSTED_JFR


def test_the_tool_runs_as_nobody_without_privileges_and_is_cut_at_its_bounds():
    code, out, _ = run_confined(["/bin/cat", "/proc/self/status"], timeout_s=10)
    status = dict(line.split(":", 1) for line in out.decode().splitlines() if ":" in line)
    assert code == 0
    assert status["Uid"].split() == [str(NOBODY)] * 4 and status["Gid"].split() == [str(NOBODY)] * 4
    assert status["Groups"].strip() == ""
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"].strip() == "1"
    # a tool that never stops writing, and one that never ends: both stopped at their bound
    with measured() as m, pytest.raises(RuntimeError, match="output passed 1 MiB"):
        run_confined(["/usr/bin/yes", "x" * 1000], timeout_s=10, max_out=1 << 20)
    assert m["seconds"] < MAX_SECONDS and m["peak"] < 8 << 20
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="did not finish within 1 s"):
        run_confined(["/bin/sleep", "30"], timeout_s=1)
    assert time.monotonic() - t0 < 3


def test_a_jvm_started_from_nobodys_jdk_is_read_with_the_hosts_jfr_never_its_own(memdiag, fake_jdk):
    """The issue's case: the JVM's executable (and so its java.home) is in a JDK whose bin/jfr is
    the attacker's. memdiag's recording is read, by the host's jfr; the script never runs."""
    home, marker = fake_jdk
    from jvmkit import JAVA, JavaWorkload
    from kit import wait_until

    w = JavaWorkload("OrderService", "1000", jvm=["-Xmx256m"], user=NOBODY)
    w.argv = [str(home / "bin" / "java") if a == str(JAVA) else a for a in w.argv]
    w.start()
    try:
        assert os.readlink(f"/proc/{w.pid}/exe") == str(home / "bin" / "java")
        wait_until(lambda: (read_perfdata(w.pid) is not None), "the JVM's counters")
        assert jvm_counters(read_perfdata(w.pid)).java_home == str(home)  # what memdiag read its jfr from
        args = ("probe", "jfr", "--pid", str(w.pid), "--duration", "4", "--budget-ms", "4000", "--json")
        done = memdiag(*args, timeout=120)
    finally:
        w.stop()
    result = json.loads(done.stdout)
    assert not marker.exists(), marker.read_text()
    assert result["tool"].startswith("/usr/lib/jvm/") and "this host's JDK" in result["tool"], result
    assert result["status"] in ("ok", "partial"), result.get("reason")
    assert result["old_samples"] + result["alloc_samples"] > 0
    assert any(a["site"] and a["site"].startswith("OrderService.") for a in result["allocating"]), result["allocating"]


# --- 2. bounded, safe reads ---------------------------------------------------------------------------


def _jdk_root(tmp_path: Path) -> tuple[Path, str, Path]:
    """A container-like root holding a JDK whose libjvm.so is mapped: (root, libjvm path, release)."""
    root = tmp_path / "root"
    home = root / "opt" / "jdk"
    (home / "lib" / "server").mkdir(parents=True)
    (home / "lib" / "server" / "libjvm.so").write_bytes(b"\x7fELF")
    return root, "/opt/jdk/lib/server/libjvm.so", home / "release"


def test_a_release_file_linked_to_dev_zero_is_not_read(tmp_path):
    root, libjvm, release = _jdk_root(tmp_path)
    release.symlink_to("/dev/zero")
    with measured() as m:
        version, detail = jvm_version(libjvm, root)
    assert (version, detail) == (None, None)  # not a regular file (and, in the root, no /dev/zero)
    assert m["seconds"] < MAX_SECONDS and m["peak"] < MAX_PEAK


def test_a_release_file_linked_to_a_host_file_never_puts_it_in_the_report(tmp_path):
    secret = Path(tempfile.mkdtemp(prefix="memdiag-secret-"))
    try:
        host_file = secret / "release"
        host_file.write_text(f'JAVA_VERSION="{MARKER}-release"\nIMPLEMENTOR="{MARKER}"\n')
        host_file.chmod(0o600)  # root's alone
        # in a container's root: the absolute link resolves inside that root, where it is not
        root, libjvm, release = _jdk_root(tmp_path)
        release.symlink_to(host_file)
        assert jvm_version(libjvm, root, (NOBODY, NOBODY)) == (None, None)
        # on the host (the target's root is memdiag's): a file only root reads is not read for nobody
        host_jdk = secret / "jdk"
        (host_jdk / "lib" / "server").mkdir(parents=True)
        (host_jdk / "release").symlink_to(host_file)
        version, detail = jvm_version(str(host_jdk / "lib" / "server" / "libjvm.so"), Path("/"), (NOBODY, NOBODY))
        assert MARKER not in f"{version} {detail}"
        # and what is readable says a version only where it looks like one
        host_file.chmod(0o644)
        version, detail = jvm_version(str(host_jdk / "lib" / "server" / "libjvm.so"), Path("/"), (NOBODY, NOBODY))
        assert version is None and MARKER not in f"{version} {detail}"
    finally:
        shutil.rmtree(secret, ignore_errors=True)


def test_a_release_file_that_is_a_fifo_never_blocks(tmp_path):
    root, libjvm, release = _jdk_root(tmp_path)
    os.mkfifo(release)
    with measured() as m:
        assert jvm_version(libjvm, root) == (None, None)
    assert m["seconds"] < MAX_SECONDS


def test_the_real_jdks_release_is_still_read():
    version, detail = jvm_version(str(JDK17 / "lib" / "server" / "libjvm.so"), Path("/"), (NOBODY, NOBODY))
    assert version is not None and version.startswith("17.") and detail


def _shared_string_perfdata(entries: int = 65534, string: int = 2 << 20) -> bytes:
    """hsperfdata whose `entries` string counters all point at one `string`-byte string."""
    header = struct.calcsize("<iiibbbbi")
    names = [f"c.{i}".encode() + b"\0" for i in range(entries)]
    sizes = [(header + len(n) + 7) // 8 * 8 for n in names]
    body_len = sum(sizes)
    shared_at = 32 + body_len
    body, at = bytearray(), 32
    for name, size in zip(names, sizes, strict=True):
        entry = struct.pack("<iiibbbbi", size, header, string, ord("B"), 0, 5, 1, shared_at - at) + name
        body += entry + b"\0" * (size - len(entry))
        at += size
    total = 32 + len(body) + string
    prologue = b"\xca\xfe\xc0\xc0" + struct.pack("<bbbbiiqii", 1, 2, 0, 1, total, 0, 0, 32, entries)
    return bytes(prologue + body + b"A" * (string - 1) + b"\0")


def test_hsperfdata_with_65534_entries_sharing_a_2_mib_string_is_parsed_within_bounds():
    data = _shared_string_perfdata()
    with measured() as m:
        perf = parse_perfdata(data)
    assert perf is not None and perf.skipped >= 65534 - 8192
    assert sum(len(v) for v in perf.entries.values() if isinstance(v, str)) <= 1 << 20
    assert m["seconds"] < MAX_SECONDS and m["peak"] < MAX_PEAK, m
    # strings within HotSpot's own bound, shared by many entries: decoded up to 1 MiB in all
    perf = parse_perfdata(_shared_string_perfdata(entries=8000, string=4000))
    assert perf is not None and 0 < len(perf.entries) <= (1 << 20) // 4000 + 1 and perf.skipped > 0


def test_a_counter_of_2_63_minus_1_never_spins_the_loops():
    huge = 2**63 - 1
    data = perfdata(
        {
            "sun.gc.policy.generations": huge,
            "sun.gc.generation.0.name": "young",
            "sun.gc.generation.0.spaces": huge,
            "sun.gc.generation.0.space.0.used": 5,
            "sun.gc.generation.0.capacity": 1,
            "sun.gc.generation.0.maxCapacity": 2,
        }
    )
    t0 = time.monotonic()
    counters = jvm_counters(parse_perfdata(data))
    assert time.monotonic() - t0 < MAX_SECONDS
    assert [s.used for s in counters.spaces] == [5] and counters.heap_max == 2


def test_an_entry_count_that_lies_is_cut_at_the_bound():
    data = bytearray(perfdata({"a": 1, "b": 2}))
    struct.pack_into("<i", data, 28, 2**31 - 1)  # the prologue's entry count
    with measured() as m:
        perf = parse_perfdata(bytes(data))
    assert perf is not None and perf.entries == {"a": 1, "b": 2}
    assert m["seconds"] < MAX_SECONDS


@settings(max_examples=300, deadline=500, suppress_health_check=[HealthCheck.too_slow])
@given(body=st.binary(max_size=8192), count=st.integers(-(2**31), 2**31 - 1), used=st.integers(-(2**31), 2**31 - 1))
def test_parse_perfdata_of_any_bytes_ends_fast_and_never_raises(body, count, used):
    data = b"\xca\xfe\xc0\xc0" + struct.pack("<bbbbiiqii", 1, 2, 0, 1, used, 0, 0, 32, count) + body
    perf = parse_perfdata(data)
    assert perf is not None and len(perf.entries) <= 8192
    jvm_counters(perf)


# --- the attach socket ----------------------------------------------------------------------------


@pytest.fixture
def fake_listener(tmp_path):
    """A Unix socket where memdiag looks for a JVM's (its /tmp/.java_pid<nspid>, in a root of the
    test's) answering as the test says; (Jvm, set the answer). Closed at the end."""
    nspid = 4242
    tmp = tmp_path / "proc" / "root" / "tmp"
    tmp.mkdir(parents=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    cwd = os.getcwd()
    os.chdir(tmp)  # a short name to bind (sun_path holds 108 bytes)
    try:
        server.bind(f".java_pid{nspid}")
    finally:
        os.chdir(cwd)
    server.listen(4)
    mode = {"answer": "stream", "accepted": 0}
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            mode["accepted"] += 1
            with conn, contextlib.suppress(OSError):
                conn.recv(4096)
                if mode["answer"] == "stream":  # never stops answering
                    chunk = b"0\n" + b"x" * 65536
                    while not stop.is_set():
                        conn.sendall(chunk)
                else:  # a byte now and then: never done, never silent long enough for a per-read timeout
                    conn.sendall(b"0\n")
                    while not stop.is_set():
                        conn.sendall(b"y")
                        time.sleep(0.05)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    jvm = Jvm(pid=os.getpid(), nspid=nspid, uid=0, gid=0, start_ticks=None, proc=tmp_path / "proc")
    yield jvm, mode
    stop.set()
    server.close()
    t.join(5)


def test_an_attach_listener_that_never_stops_answering_costs_a_bounded_reply(fake_listener):
    jvm, mode = fake_listener
    with measured() as m, pytest.raises(AttachRefused, match="passed 16 MiB"):
        jcmd(jvm, "JFR.check", timeout_s=10)
    assert m["seconds"] < 5 and m["peak"] < MAX_REPLY_BYTES + (4 << 20), m


def test_an_attach_listener_that_drips_is_cut_at_the_deadline(fake_listener):
    jvm, mode = fake_listener
    mode["answer"] = "drip"
    with measured() as m, pytest.raises(AttachRefused, match="within 1 s"):
        jcmd(jvm, "JFR.check", timeout_s=1)
    assert m["seconds"] < 2, m


def test_an_attach_socket_or_tmp_planted_as_a_link_is_not_followed(fake_listener, tmp_path):
    jvm, mode = fake_listener
    tmp = tmp_path / "proc" / "root" / "tmp"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp / f".java_pid{jvm.nspid}").rename(elsewhere / "real")
    (tmp / f".java_pid{jvm.nspid}").symlink_to(elsewhere / "real")
    with pytest.raises(AttachRefused, match="has no attach socket"):  # a link is no socket: never connected
        jcmd(jvm, "JFR.check", timeout_s=1)
    # the JVM's /tmp a link to a folder of the host's holding a socket: resolved inside the root
    (tmp / f".java_pid{jvm.nspid}").unlink()
    (elsewhere / "real").rename(elsewhere / f".java_pid{jvm.nspid}")
    shutil.rmtree(tmp)
    tmp.symlink_to(elsewhere)  # absolute: inside the root it names a path that is not there
    with pytest.raises(AttachRefused, match="has no attach socket"):
        jcmd(jvm, "JFR.check", timeout_s=1)
    assert mode["accepted"] == 0


# --- 3. nothing left behind --------------------------------------------------------------------------


def test_a_dead_memdiags_recording_and_files_are_removed_and_a_live_ones_kept(java):
    w = java("OrderService", "100", jvm=["-Xmx64m"])
    time.sleep(1)  # the JVM's signal handlers in place (SigCgt), as ready_counters waits elsewhere
    jvm = describe_target(w.pid)
    dead = Recording(jvm, planned_s=30, owner="999999999-1")  # a memdiag that no longer runs
    live = Recording(jvm, planned_s=30)  # this one's (alive)

    def plant(rec: Recording) -> None:  # a first look's file, as a killed memdiag leaves it
        with jvm_tmp(jvm) as tmp:
            fd = os.open(rec.file("mid.jfr"), os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=tmp)
            os.fchown(fd, jvm.uid, jvm.gid)
            os.close(fd)

    try:
        dead.start()
        dead.started = False  # killed: its close would do nothing
        plant(dead)
        live.start()  # a new memdiag's start removes what the dead one left
        removed = [f"/tmp/{dead.name}.jfr removed", f"/tmp/{dead.name}.mid.jfr removed"]
        assert live.cleaned[0] == f"recording {dead.name} stopped" and sorted(live.cleaned[1:]) == removed
        plant(live)
        assert clean_stale(jvm) == []  # a live memdiag's recording and files: never touched
        listed = jcmd(jvm, "JFR.check").output
        assert f"name={dead.name}" not in listed
        assert f"name={live.name}" in listed and "(running)" in listed
        with jvm_tmp(jvm) as tmp:
            # these two recordings' files only: /tmp is shared with other memdiags (memdiag-bpf-*)
            left = sorted(n for n in os.listdir(tmp) if n.startswith((dead.name, live.name)))
        assert left == sorted([f"{live.name}.jfr", f"{live.name}.mid.jfr"]), left
    finally:
        live.close()
        dead.started = True
        dead.close()
    with jvm_tmp(jvm) as tmp:
        assert not [n for n in os.listdir(tmp) if n.startswith((dead.name, live.name))]
    assert not [r.private for r in (dead, live) if r.private is not None and r.private.exists()]  # the copies
    assert jfrmod.SELF_STOP_MARGIN_S <= 10


def _fake_proc(tmp_path: Path, pid: int = 4321) -> tuple[Path, Path]:
    """A /proc of the test's: PID's status (root's, NSpid its own) and its root with a /tmp."""
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "status").write_text(f"Name:\tjava\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\nNSpid:\t{pid}\n")
    tmp = proc / str(pid) / "root" / "tmp"
    tmp.mkdir(parents=True)
    return proc, tmp


def test_hsperfdata_is_found_inside_the_targets_root_and_never_through_a_link(tmp_path):
    pid = 4321
    proc, tmp = _fake_proc(tmp_path, pid)
    good = perfdata({"sun.os.hrt.frequency": 1000, "java.property.java.vm.specification.version": "17"})
    (tmp / "hsperfdata_root").mkdir()
    (tmp / "hsperfdata_root" / str(pid)).write_bytes(good)
    found = read_perfdata(pid, proc)
    assert found is not None and found.text("java.property.java.vm.specification.version") == "17"
    # the file a link (to a host file of the right shape): not followed
    host = tmp_path / "host-perfdata"
    host.write_bytes(perfdata({"java.property.java.home": MARKER}))
    (tmp / "hsperfdata_root" / str(pid)).unlink()
    (tmp / "hsperfdata_root" / str(pid)).symlink_to(host)
    assert read_perfdata(pid, proc) is None
    # its folder a link out of the root (absolute: resolved inside the root, where it is not)
    shutil.rmtree(tmp / "hsperfdata_root")
    (tmp_path / "hostdir").mkdir()
    (tmp_path / "hostdir" / str(pid)).write_bytes(perfdata({"java.property.java.home": MARKER}))
    (tmp / "hsperfdata_root").symlink_to(tmp_path / "hostdir")
    assert read_perfdata(pid, proc) is None
    # a FIFO in its place: never blocks
    (tmp / "hsperfdata_root").unlink()
    (tmp / "hsperfdata_root").mkdir()
    os.mkfifo(tmp / "hsperfdata_root" / str(pid))
    t0 = time.monotonic()
    assert read_perfdata(pid, proc) is None and time.monotonic() - t0 < MAX_SECONDS


def test_the_copy_is_readable_by_the_unprivileged_tool_whatever_the_umask(tmp_path):
    """serve runs with umask 077: the copy came out 0400 and the jfr tool, as nobody, could not
    open it (an alert on a JVM container: 'jfr print: could not open file ... (Permission denied)')."""
    src = tmp_path / "rec.jfr"
    src.write_bytes(b"FLR\0" + b"x" * 100)
    dest = tmp_path / "copy.jfr"
    fd = os.open(src, os.O_RDONLY)
    old = os.umask(0o077)
    try:
        jfrmod._copy_bounded(fd, dest, 1 << 20)
    finally:
        os.umask(old)
        os.close(fd)
    assert dest.stat().st_mode & 0o777 == 0o444 and dest.read_bytes() == src.read_bytes()
