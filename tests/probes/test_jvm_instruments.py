"""The JVM's own instruments on the real JVM (Debian's OpenJDK 17): its counters read without
attaching, the attach protocol spoken by memdiag as the JVM's user, never a signal to a process
that would not survive one, a flight recording that names the class, the allocating method and
the holder and leaves nothing behind, and the JIT's perf map naming Java frames in native stacks."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from jvmkit import JAVA_HOME, have_jdk
from kit import wait_until
from memdiag.probes.jvm.attach import AttachRefused, describe_target, jcmd, jvm_tmp, refusal, start_listener
from memdiag.probes.jvm.jfr import MID, Recording, print_json
from memdiag.probes.jvm.perfmap import jit_perf_map
from memdiag.probes.jvm.recording import held, parse_recording
from memdiag.probes.jvm.tool import trusted_jfr
from memdiag.system.hsperfdata import perfdata_absence, read_perfdata
from memdiag.system.jvm import jvm_counters, read_jvm_memory

pytestmark = [
    pytest.mark.skipif(not have_jdk(), reason="needs a JDK (scripts/setup.sh --test installs openjdk-17)"),
    # its JVMs' recording and histogram costs are measured and kept (probes/jvm/costs.py): run alone
    pytest.mark.alone,
]


def counters(pid: int):
    perf = read_perfdata(pid)
    return jvm_counters(perf) if perf is not None else None


def ready_counters(pid: int, collected: bool = True):
    """The JVM's counters once it has initialised (and collected once, unless collected=False)."""
    wait_until(
        lambda: counters(pid) is not None and (counters(pid).gc_count > 0 or not collected), "the JVM's counters"
    )
    return counters(pid)


def recording_running(rec: Recording) -> bool:
    """JFR.check lists the recording as running (a stopped one stays listed until it is closed)."""
    return any(
        f"name={rec.name}" in line and "(running)" in line for line in jcmd(rec.jvm, "JFR.check").output.splitlines()
    )


def leftovers(pid: int, rec: Recording | None = None) -> list[str]:
    """memdiag's files for this JVM in its /tmp and working directory: the attach trigger, the perf
    map, the recording's settings and file (the JVM's own socket is not one)."""
    tmp = Path(f"/proc/{pid}/root/tmp")
    cwd = Path(f"/proc/{pid}/cwd")
    mine = (f".attach_pid{pid}", f"perf-{pid}.map", *((rec.name,) if rec else ()))
    return sorted(p.name for p in [*tmp.iterdir(), *cwd.iterdir()] if p.name.startswith(mine))


def test_counters_of_a_real_jvm_without_attaching(java):
    w = java("OrderService", "1000", jvm=["-Xmx256m", "-XX:+UseSerialGC"])
    first = ready_counters(w.pid)
    assert first.heap_max == 256 << 20  # Serial: young + old maxima are -Xmx
    assert first.policy == "Copy:MSC" and first.java_home == str(JAVA_HOME)
    assert "-Xmx256m" in first.vm_args and first.command.startswith("OrderService")
    assert first.attach_supported is True
    wait_until(lambda: counters(w.pid).after_gc_used > first.after_gc_used + (2 << 20), "the retry list to grow")
    mem = read_jvm_memory(w.pid, counters(w.pid))
    assert mem.heap_range is not None and mem.heap_range[1] - mem.heap_range[0] == 256 << 20
    assert 0 < mem.heap < mem.rss and mem.other is not None
    assert not Path(f"/tmp/.java_pid{w.pid}").exists()  # nothing attached: no listener was started


def test_no_counters_file_is_said_with_the_flag_that_turned_it_off(java):
    w = java("OrderService", "100", jvm=["-Xmx64m", "-XX:-UsePerfData"])
    assert read_perfdata(w.pid) is None
    assert "-XX:-UsePerfData" in perfdata_absence(w.pid)


def test_attach_as_the_jvms_own_user_and_the_trigger_file_is_removed(java):
    w = java("OrderService", "100", jvm=["-Xmx64m"], user=65534)
    ready_counters(w.pid)
    jvm = describe_target(w.pid)
    assert (jvm.uid, jvm.gid) == (65534, 65534)
    reply = jcmd(jvm, "VM.version")
    assert reply.ok and "JDK 17" in reply.output
    sock = Path(f"/tmp/.java_pid{w.pid}")
    assert sock.stat().st_uid == 65534  # the JVM's own listener, as its own user
    assert leftovers(w.pid) == []
    assert start_listener(jvm) is True  # running already: no second signal


def test_never_a_signal_to_a_jvm_that_refuses_attach(java):
    for env, flags in (
        ({}, ["-XX:+DisableAttachMechanism"]),
        ({"JAVA_TOOL_OPTIONS": "-XX:+DisableAttachMechanism"}, []),
    ):
        w = java("OrderService", "100", jvm=["-Xmx64m", *flags], env=env)
        ready_counters(w.pid)
        assert "DisableAttachMechanism" in (refusal(w.pid) or "")
        with pytest.raises(AttachRefused, match="DisableAttachMechanism"):
            jcmd(describe_target(w.pid), "VM.version")
        assert w.proc.poll() is None and leftovers(w.pid) == []
        assert not Path(f"/tmp/.java_pid{w.pid}").exists()


def test_xrs_is_attached_through_its_listener_from_start_up_never_signalled(java):
    """-Xrs: the JVM leaves SIGQUIT uncaught (it would die of it) and starts its listener at start-up."""
    w = java("OrderService", "100", jvm=["-Xmx64m", "-Xrs"])
    jvm = describe_target(w.pid)
    wait_until(lambda: Path(f"/tmp/.java_pid{w.pid}").exists(), "the listener -Xrs starts at start-up")
    assert start_listener(jvm) is True
    assert jcmd(jvm, "VM.uptime").ok and w.proc.poll() is None


def test_a_process_that_is_no_jvm_is_refused_and_not_signalled(workload):
    w = workload("leak", "64")
    assert "not a HotSpot JVM" in refusal(w.pid)
    with pytest.raises(AttachRefused):
        describe_target(w.pid)
    assert w.proc.poll() is None


def read(rec: Recording, path: Path) -> str:
    """The recording read by the host's trusted jfr, on memdiag's own copy of it."""
    tool, how = trusted_jfr(17)
    assert tool is not None and tool.path.startswith("/usr/lib/jvm/"), how
    assert path == rec.copies["jfr"] and path.parent == rec.private, path
    return print_json(tool, rec)


def test_a_recording_names_the_class_the_allocating_method_and_the_static_field_holding_it(java):
    w = java("OrderService", "1000", jvm=["-Xmx512m"])
    ready_counters(w.pid)
    rec = Recording(describe_target(w.pid), planned_s=10, cutoff_ms=500)
    try:
        started = time.time()
        rec.start()
        # the settings file went once JFR.start had read it; the destination the JVM made stays till close
        assert leftovers(w.pid, rec) == [f"{rec.name}.jfr"]
        time.sleep(8)
        stopped = time.time()
        path = rec.stop()
        groups = held(parse_recording(read(rec, path)), started, stopped)
    finally:
        rec.close()
    top = groups[0]
    assert top.cls == "byte[]"
    assert top.site.startswith("OrderService.processBatch(int) line: ")
    assert top.anchor == "OrderService.retryQueue"
    assert top.chain[-2:] == ["java.util.ArrayList.elementData", "OrderService.retryQueue"]
    assert top.kept_percent > 50  # what the list took it never let go
    assert leftovers(w.pid, rec) == []
    assert not recording_running(rec)


def test_a_cache_holder_is_named_and_lets_its_entries_go(java):
    # old-object samples are few (taken as threads refill their allocation buffers, kept when they
    # outlive a collection): 2,000 lookups/s over 20 s leave some of the cache's live entries sampled
    w = java("LruCache", "2000", "4000", jvm=["-Xmx1g"])
    ready_counters(w.pid)
    rec = Recording(describe_target(w.pid), planned_s=22, cutoff_ms=500)
    try:
        started = time.time()
        rec.start()
        time.sleep(20)
        stopped = time.time()
        groups = held(parse_recording(read(rec, rec.stop())), started, stopped)
    finally:
        rec.close()
    cache = next((g for g in groups if g.anchor == "LruCache.cache"), None)
    assert cache is not None, [(g.cls, g.site, g.anchor) for g in groups]
    assert cache.cls == "byte[]" and cache.site.startswith("LruCache.load(int) line: ")
    assert "java.util.LinkedHashMap$Entry.value" in cache.chain
    assert cache.holder_detail == "Size: 4000"


def test_closing_a_recording_never_stopped_stops_it_and_removes_its_files(java):
    w = java("OrderService", "100", jvm=["-Xmx64m"])
    ready_counters(w.pid)
    rec = Recording(describe_target(w.pid), planned_s=5)
    rec.start()
    assert recording_running(rec)
    rec.close()
    assert not recording_running(rec)
    assert leftovers(w.pid, rec) == [] and rec.notes == []


def test_jit_frames_are_named_from_the_jvms_perf_map_and_its_file_removed(java):
    w = java("NativeLeak", "2000", jvm=["-Xmx64m"])
    ready_counters(w.pid, collected=False)
    wait_until(lambda: (counters(w.pid).clock_s or 0) > 3, "the JIT to compile the hot loop")
    found = jit_perf_map(w.pid, ask=True)
    assert found is not None and len(found.symbols) > 10
    assert any(s.name.startswith("NativeLeak.recordOrder(") for s in found.symbols)
    assert leftovers(w.pid) == []


def test_a_jvm_killed_mid_recording_is_left_with_nothing_running(java):
    """memdiag dies without stopping it: the JVM stops the recording itself at its duration."""
    w = java("OrderService", "100", jvm=["-Xmx64m"])
    ready_counters(w.pid)
    rec = Recording(describe_target(w.pid), planned_s=1, margin_s=2)
    rec.start()
    rec.started = False  # as if memdiag had died here: nothing of it stops the recording
    wait_until(lambda: not recording_running(rec), "the JVM's own stop", timeout=20)
    with jvm_tmp(rec.jvm) as tmp:  # what it wrote then: 0600, as memdiag made it
        assert stat.S_IMODE(os.stat(rec.file("jfr"), dir_fd=tmp).st_mode) == 0o600
    rec.close()
    assert leftovers(w.pid, rec) == []


def test_a_jvm_that_exits_after_its_recording_stopped_is_still_read_and_leaves_nothing(java):
    """A heap near -Xmx dies of OutOfMemoryError mid-window: the recording it wrote is still read
    and removed once it has gone (stop 35's CI: both files left in /tmp, the first look lost)."""
    w = java("OrderService", "100", jvm=["-Xmx64m"])
    ready_counters(w.pid)
    rec = Recording(describe_target(w.pid), planned_s=10, cutoff_ms=100)
    tool, how = trusted_jfr(17)
    assert tool is not None, how
    rec.start()
    time.sleep(2)
    assert rec.dump() is not None
    assert rec.stop() is not None
    w.stop()
    assert not Path(f"/proc/{w.pid}").exists()  # gone, and its /proc/PID/root with it
    # both read after the JVM exited
    first, final = (json.loads(print_json(tool, rec, s))["recording"]["events"] for s in (MID, "jfr"))
    assert first and final
    private = rec.private
    rec.close()
    assert not [p.name for p in Path("/tmp").iterdir() if p.name.startswith(rec.name)]
    assert private is not None and not private.exists()
