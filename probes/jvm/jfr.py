"""A flight recording of the JVM's own memory events, started, stopped and read by memdiag, and
never left behind.

The recording (JFR.start through the attach socket) has memdiag's own name and settings: old-
object samples (objects sampled at allocation that are still alive when the recording stops, each
with its allocation stack and, within `cutoff`, its chain of references to a GC root), throttled
allocation samples (class, stack, bytes they stand for), GC heap summaries (heap used before and
after each collection), collections and direct-buffer statistics. Nothing else: no method
sampling, no I/O events.

The settings file is written into the JVM's /tmp (as its user) and removed once JFR.start has read
it. The recording is kept in memory (disk=false: no repository folder), with its destination file
named at start and a `duration`, so that the JVM stops it by itself should memdiag die without
stopping it (killed, or a third signal): it then writes the file and records nothing more. JFR.dump at
its first look and JFR.stop at its end write what it holds (and, before it, the old-object samples'
paths to GC roots, in a safepoint bounded by `cutoff`); memdiag reads both with the JDK's own `jfr`
tool and removes them: two looks at the same holders, some seconds apart, say whether they grew. Every exit path stops
the recording and removes the files (Recording.close, also at interpreter exit).

What stays in the JVM is what any jcmd leaves: its attach listener thread and socket, and JFR's
threads once JFR has started (JFR Recorder Thread, JFR Periodic Tasks), idle."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .attach import AttachRefused, Jvm, jcmd, start_listener

MID = "mid.jfr"  # the dump of the recording at its first look (Recording.dump)
# Stop margin: the JVM stops the recording itself this long after the time memdiag planned.
SELF_STOP_MARGIN_S = 60
TOOL_TIMEOUT_S = 60
EVENTS = (
    "jdk.OldObjectSample",
    "jdk.ObjectAllocationSample",
    "jdk.GCHeapSummary",
    "jdk.GarbageCollection",
    "jdk.DirectBufferStatistics",
)


def settings_xml(throttle_per_s: int, cutoff_ms: int) -> str:
    """memdiag's event settings (a .jfc file). cutoff: the longest the JVM may search for the old
    objects' paths to GC roots when the recording stops (a safepoint: the target is paused)."""
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<configuration version="2.0" label="memdiag" description="memdiag: what holds the Java heap" provider="memdiag">
  <event name="jdk.OldObjectSample">
    <setting name="enabled">true</setting>
    <setting name="stackTrace">true</setting>
    <setting name="cutoff">{int(cutoff_ms)} ms</setting>
  </event>
  <event name="jdk.ObjectAllocationSample">
    <setting name="enabled">true</setting>
    <setting name="throttle">{int(throttle_per_s)}/s</setting>
    <setting name="stackTrace">true</setting>
  </event>
  <event name="jdk.GCHeapSummary"><setting name="enabled">true</setting></event>
  <event name="jdk.GarbageCollection">
    <setting name="enabled">true</setting>
    <setting name="threshold">0 ms</setting>
  </event>
  <event name="jdk.DirectBufferStatistics">
    <setting name="enabled">true</setting>
    <setting name="period">5 s</setting>
  </event>
</configuration>
"""


_OPEN: set[Recording] = set()  # recordings started and not yet closed, for the exit hook
_OPEN_LOCK = threading.Lock()


def _token() -> str:
    """A recording's name suffix, random. secrets is imported here, for a JVM target alone: it
    imports hmac, which maps OpenSSL's libcrypto (3.5 MiB of memdiag's resident memory)."""
    import secrets

    return secrets.token_hex(6)


@dataclass
class Recording:
    """One recording of memdiag's in one JVM, from start to close."""

    jvm: Jvm
    planned_s: float
    throttle_per_s: int = 100
    cutoff_ms: int = 100
    margin_s: float = SELF_STOP_MARGIN_S  # the JVM stops it itself this long after planned_s
    token: str = field(default_factory=_token)
    started: bool = False
    stopped: bool = False
    listener_was_there: bool | None = None
    start_reply_s: float | None = None
    stop_reply_s: float | None = None
    notes: list[str] = field(default_factory=list)  # what went wrong on the way out
    tmp: Path | None = None  # the JVM's /tmp as memdiag reaches it (outside())

    @property
    def name(self) -> str:
        return f"memdiag-{self.token}"

    def inside(self, suffix: str) -> str:
        """A file of memdiag's in the JVM's /tmp, as the JVM names it."""
        return f"/tmp/{self.name}.{suffix}"

    def outside(self, suffix: str) -> Path:
        """The same file as memdiag reaches it: through memdiag's own /tmp where the JVM shares
        memdiag's root and mounts, so the recording is still read and removed once the JVM has exited
        (a heap near -Xmx dies of OutOfMemoryError mid-window, and /proc/PID/root goes with it: stop
        37's fresh-clone run then left both files in /tmp and lost the first look); else through
        /proc/PID/root (a container, a service with a private /tmp), fixed at the first use."""
        if self.tmp is None:
            proc = self.jvm.proc
            shared = _same_root(proc) and _same(proc / "ns" / "mnt", Path("/proc/self/ns/mnt"))
            self.tmp = Path("/tmp") if shared else proc / "root" / "tmp"
        return self.tmp / f"{self.name}.{suffix}"

    def start(self) -> str:
        """Write the settings, start the recording, remove the settings; the JVM's reply."""
        settings = self.outside("jfc")
        _write_as(settings, settings_xml(self.throttle_per_s, self.cutoff_ms), self.jvm.uid, self.jvm.gid)
        with _OPEN_LOCK:
            _OPEN.add(self)
        try:
            duration = max(1, int(self.planned_s + self.margin_s))
            command = (
                f"JFR.start name={self.name} settings={self.inside('jfc')} disk=false "
                f"duration={duration}s filename={self.inside('jfr')}"
            )

            self.listener_was_there = start_listener(self.jvm)
            reply = jcmd(self.jvm, command, timeout_s=30)
            self.start_reply_s = reply.seconds
            if not reply.ok or "Started recording" not in reply.output:
                raise AttachRefused(f"JFR.start failed: {_first_line(reply.output) or reply.status}")
            self.started = True
            return reply.output
        finally:
            _unlink(settings)

    def stop(self) -> Path | None:
        """Stop the recording: the JVM writes it (and the old objects' paths to GC roots). The file
        as memdiag reaches it, or None when the JVM wrote none."""
        if not self.started or self.stopped:
            return None
        self.stopped = True
        reply = jcmd(self.jvm, f"JFR.stop name={self.name}", timeout_s=60)
        self.stop_reply_s = reply.seconds
        if not reply.ok or "Stopped recording" not in reply.output:
            self.notes.append(f"JFR.stop: {_first_line(reply.output) or reply.status}")
        path = self.outside("jfr")
        return path if path.exists() else None

    def dump(self, suffix: str = MID) -> Path | None:
        """A copy of what the recording holds so far, old objects' paths to GC roots included (a
        safepoint, within the cutoff), written by the JVM to a file of memdiag's; None if none came."""
        if not self.started or self.stopped:
            return None
        reply = jcmd(self.jvm, f"JFR.dump name={self.name} filename={self.inside(suffix)}", timeout_s=60)
        if not reply.ok or "Dumped recording" not in reply.output:
            self.notes.append(f"JFR.dump: {_first_line(reply.output) or reply.status}")
        path = self.outside(suffix)
        return path if path.exists() else None

    def close(self) -> None:
        """Stopped (if it was started) and every file of memdiag's removed; never raises."""
        if self.started and not self.stopped:
            try:
                self.stop()
            except (AttachRefused, OSError) as e:
                self.notes.append(f"could not stop the recording {self.name}: {e}")
        for suffix in ("jfc", "jfr", MID):
            _unlink(self.outside(suffix))
        with _OPEN_LOCK:
            _OPEN.discard(self)

    def __hash__(self) -> int:
        return hash(self.token)


def _close_all() -> None:
    for r in list(_OPEN):
        r.close()


atexit.register(_close_all)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _write_as(path: Path, text: str, uid: int, gid: int) -> None:
    """A new file (never through a link, never over another's) readable by the JVM's user."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    try:
        os.fchown(fd, uid, gid)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


# --- reading a recording with the JDK's own jfr tool ----------------------------------------------


def _same_root(proc: Path) -> bool:
    """The target sees the same root directory as memdiag (not a container's)."""
    return _same(proc / "root", Path("/"))


def _same(a: Path, b: Path) -> bool:
    """One file (a root directory, a namespace) seen by two paths; False where either is unreadable."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@dataclass(frozen=True)
class Tool:
    """How to run the target JDK's jfr tool: its command, in words, and whether it runs inside the
    target's namespaces (and so names the recording's file as the JVM does)."""

    cmd: list[str]
    how: str
    inside: bool


def jfr_tool(jvm: Jvm, java_home: str | None) -> tuple[Tool | None, str]:
    """The target's own jfr tool (its JDK's bin/jfr): run directly when the target shares memdiag's
    root, else inside the target's namespaces as its user (nsenter), as the container would run it.
    (None, why) when its JDK has none (a JRE, a jlink image)."""
    homes = [java_home] if java_home else []
    with contextlib.suppress(OSError):  # the java binary's own JDK: /proc/PID/exe's folder
        exe = os.readlink(jvm.proc / "exe")
        homes.append(str(Path(exe).parent.parent))
    flags = ["-J-XX:-UsePerfData", "-J-Xmx256m", "-J-XX:TieredStopAtLevel=1"]
    same = _same_root(jvm.proc)
    for home in dict.fromkeys(homes):
        tool = f"{home}/bin/jfr"
        reach = Path(tool) if same else jvm.proc / "root" / tool.lstrip("/")
        if not os.access(reach, os.X_OK):
            continue
        if same:
            found = Tool(["nice", "-n", "10", tool, *flags], f"{tool} (the target's JDK)", inside=False)
            return found, found.how
        uid, gid = _inside_id(jvm.proc / "uid_map", jvm.uid), _inside_id(jvm.proc / "gid_map", jvm.gid)
        enter = ["nsenter", "--target", str(jvm.pid), "--all", f"--setuid={uid}", f"--setgid={gid}"]
        found = Tool(
            ["nice", "-n", "10", *enter, "--", tool, *flags], f"{tool} in the target's namespaces", inside=True
        )
        return found, found.how
    where = ", ".join(f"{h}/bin/jfr" for h in dict.fromkeys(homes)) or "no java.home known"
    return None, f"the target's JDK has no jfr tool to read the recording ({where} not found: a JRE or jlink image?)"


def _inside_id(map_file: Path, outside: int) -> int:
    """An id as the target's user namespace numbers it (uid_map: inside outside count)."""
    with contextlib.suppress(OSError, ValueError):
        for line in map_file.read_text().splitlines():
            inside, start, count = (int(x) for x in line.split())
            if start <= outside < start + count:
                return inside + outside - start
    return outside


def print_json(tool: Tool, rec: Recording, suffix: str = "jfr", stack_depth: int = 12) -> str:
    """`jfr print --json` of memdiag's events in one of the recording's files (RuntimeError with the
    tool's message on failure)."""
    path = rec.inside(suffix) if tool.inside else str(rec.outside(suffix))
    cmd = [*tool.cmd, "print", "--json", "--stack-depth", str(stack_depth), "--events", ",".join(EVENTS), path]
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=TOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RuntimeError(f"the jfr tool did not run: {e}") from None
    if done.returncode != 0:
        err = done.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"the jfr tool failed ({done.returncode}): {err[-1] if err else ''}")
    return done.stdout.decode("utf-8", "replace")
