"""A flight recording of the JVM's own memory events, started, stopped and read by memdiag, and
never left behind.

The recording (JFR.start through the attach socket) has memdiag's own name and settings: old-
object samples (objects sampled at allocation that are still alive when the recording stops, each
with its allocation stack and, within `cutoff`, its chain of references to a GC root), throttled
allocation samples (class, stack, bytes they stand for), GC heap summaries (heap used before and
after each collection), collections and direct-buffer statistics. Nothing else: no method
sampling, no I/O events.

Its name says whose it is: memdiag-<memdiag's pid>-<memdiag's start time>-<random>. Before a new
one starts, the recordings and files of memdiag processes that no longer exist are stopped and
removed (`clean_stale`); a concurrent memdiag's, alive, are never touched.

Every file of memdiag's in the JVM's /tmp (the settings, the recording's destination, the first
look's dump) is created by memdiag, mode 0600, owned by the JVM's user, before the JVM writes it
(the JVM truncates and writes a file that is there, keeping its mode; one it creates is 0644 by its
umask), reached through a descriptor of that /tmp opened inside the JVM's own root, and removed as
soon as it has served. The recording is kept in memory (disk=false: no repository folder), with
its destination named at start and a `duration` a few seconds past memdiag's plan, so that the
JVM stops it by itself soon after should memdiag die without stopping it. JFR.dump at its first
look and JFR.stop at its end write what it holds (and, before it, the old-object samples' paths
to GC roots, in a safepoint bounded by `cutoff`); each file is copied at once (bounded, a regular
file of the JVM's user, never through a link) into memdiag's own private folder and removed from
the JVM's /tmp.

The copy is read with a `jfr` tool memdiag trusts, never the target's, run as nobody and confined
(tool.py): the recording is the target's data, and the tool parses it as hostile input.

What stays in the JVM is what any jcmd leaves: its attach listener thread and socket, and JFR's
threads once JFR has started (JFR Recorder Thread, JFR Periodic Tasks), idle."""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system.process import start_ticks
from memdiag.system.safefile import Unsafe, names_in, open_in

from .attach import AttachRefused, Jvm, jcmd, open_tmp, start_listener
from .tool import TOOL_FLAGS, OutputTooLarge, Tool, run_confined

MID = "mid.jfr"  # the dump of the recording at its first look (Recording.dump)
# Self-stop margin: the JVM stops the recording itself this long after the time memdiag planned.
# Short, so that a memdiag killed mid-recording leaves it running seconds, not a minute; long
# enough for memdiag's own stop, which comes at the planned time (JFR.stop 15-50 ms here) after a
# start that may be late by the JVM's first JFR start (~1-2 s cold). JFR has no command to extend
# a running recording's duration, so it is not renewed: it is short from the start.
SELF_STOP_MARGIN_S = 5
# A recording's file, copied from the JVM's /tmp: with disk=false the JVM keeps it in JFR's global
# buffers (memorysize, 10 MB by default), so its dump is about that; 64 MiB leaves room for a JVM
# run with larger buffers and refuses a file the target grew or replaced.
MAX_RECORDING_BYTES = 64 << 20
COPY_CHUNK = 1 << 20
EVENTS = (
    "jdk.OldObjectSample",
    "jdk.ObjectAllocationSample",
    "jdk.GCHeapSummary",
    "jdk.GarbageCollection",
    "jdk.DirectBufferStatistics",
)
_SUFFIXES = ("jfc", "jfr", MID)
# memdiag-<pid>-<start ticks>-<token>: whose the recording is, and whether that memdiag still runs
_NAME = re.compile(r"^memdiag-(?P<pid>\d+)-(?P<start>\d+)-[0-9a-f]{12}$")
_CHECK_LINE = re.compile(r"^Recording \d+: name=(?P<name>\S+)")


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
    """A recording's name suffix, random (os.urandom: secrets would import hmac, which maps
    OpenSSL's libcrypto, 3.5 MiB of memdiag's resident memory)."""
    return os.urandom(6).hex()


def owner_tag() -> str:
    """This memdiag's part of a recording's name: its pid and start time."""
    return f"{os.getpid()}-{start_ticks('self') or 0}"


def owner_alive(name: str) -> bool | None:
    """Whether the memdiag that named this recording still runs (its pid has its start time);
    None where the name is not one memdiag gives."""
    m = _NAME.match(name)
    if not m:
        return None
    return start_ticks(int(m["pid"])) == int(m["start"])


@dataclass
class Recording:
    """One recording of memdiag's in one JVM, from start to close."""

    jvm: Jvm
    planned_s: float
    throttle_per_s: int = 100
    cutoff_ms: int = 100
    margin_s: float = SELF_STOP_MARGIN_S  # the JVM stops it itself this long after planned_s
    token: str = field(default_factory=_token)
    owner: str = field(default_factory=owner_tag)
    started: bool = False
    stopped: bool = False
    listener_was_there: bool | None = None
    start_reply_s: float | None = None
    stop_reply_s: float | None = None
    notes: list[str] = field(default_factory=list)  # what went wrong on the way out
    cleaned: list[str] = field(default_factory=list)  # stale recordings and files of dead memdiags removed
    copies: dict[str, Path] = field(default_factory=dict)  # suffix -> memdiag's private copy
    private: Path | None = None  # memdiag's own folder for the copies
    tmp_fd: int | None = None  # the JVM's /tmp, opened inside its root at the first use

    @property
    def name(self) -> str:
        return f"memdiag-{self.owner}-{self.token}"

    def inside(self, suffix: str) -> str:
        """A file of memdiag's in the JVM's /tmp, as the JVM names it."""
        return f"/tmp/{self.name}.{suffix}"

    def file(self, suffix: str) -> str:
        """The same file's name in the JVM's /tmp (reached through `tmp()`)."""
        return f"{self.name}.{suffix}"

    def tmp(self) -> int:
        """A descriptor of the JVM's /tmp inside its root, kept from the first use: the files are
        still reached (and removed) once the JVM has exited (a heap near -Xmx dies of
        OutOfMemoryError mid-window; stop 37's run lost its first look and left both files)."""
        if self.tmp_fd is None:
            self.tmp_fd = open_tmp(self.jvm)
        return self.tmp_fd

    def _create(self, suffix: str, text: str = "") -> None:
        """A new file of memdiag's in the JVM's /tmp, 0600 and the JVM's user's: never through a
        link, never over another's file (O_EXCL)."""
        fd = os.open(
            self.file(suffix),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=self.tmp(),
        )
        try:
            os.fchown(fd, self.jvm.uid, self.jvm.gid)
            if text:
                os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _unlink(self, suffix: str) -> None:
        if self.tmp_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.file(suffix), dir_fd=self.tmp_fd)

    def start(self) -> str:
        """Remove what dead memdiags left, write the settings, make the destination, start the
        recording, remove the settings; the JVM's reply."""
        self.listener_was_there = start_listener(self.jvm)
        self.cleaned = clean_stale(self.jvm)
        with _OPEN_LOCK:
            _OPEN.add(self)
        try:
            self._create("jfc", settings_xml(self.throttle_per_s, self.cutoff_ms))
            self._create("jfr")
            duration = max(1, int(self.planned_s + self.margin_s))
            command = (
                f"JFR.start name={self.name} settings={self.inside('jfc')} disk=false "
                f"duration={duration}s filename={self.inside('jfr')}"
            )
            reply = jcmd(self.jvm, command, timeout_s=30)
            self.start_reply_s = reply.seconds
            if not reply.ok or "Started recording" not in reply.output:
                raise AttachRefused(f"JFR.start failed: {_first_line(reply.output) or reply.status}")
            self.started = True
            return reply.output
        finally:
            self._unlink("jfc")

    def stop(self) -> Path | None:
        """Stop the recording: the JVM writes it (and the old objects' paths to GC roots). memdiag's
        private copy of it, or None when the JVM wrote none (or it was refused: notes say why)."""
        if not self.started or self.stopped:
            return None
        self.stopped = True
        reply = jcmd(self.jvm, f"JFR.stop name={self.name}", timeout_s=60)
        self.stop_reply_s = reply.seconds
        if not reply.ok or "Stopped recording" not in reply.output:
            self.notes.append(f"JFR.stop: {_first_line(reply.output) or reply.status}")
        return self.copy("jfr")

    def dump(self, suffix: str = MID) -> Path | None:
        """A copy of what the recording holds so far, old objects' paths to GC roots included (a
        safepoint, within the cutoff), written by the JVM to a file of memdiag's and copied into
        memdiag's private folder; None if none came."""
        if not self.started or self.stopped:
            return None
        self._unlink(suffix)
        self._create(suffix)
        reply = jcmd(self.jvm, f"JFR.dump name={self.name} filename={self.inside(suffix)}", timeout_s=60)
        if not reply.ok or "Dumped recording" not in reply.output:
            self.notes.append(f"JFR.dump: {_first_line(reply.output) or reply.status}")
        return self.copy(suffix)

    def _private(self) -> Path:
        """memdiag's folder for the copies: root's, mode 0711 (nobody's jfr reaches a file in it by
        its random name; no one lists it), removed at close."""
        if self.private is None:
            self.private = Path(tempfile.mkdtemp(prefix="memdiag-jfr-"))
            os.chmod(self.private, 0o711)
        return self.private

    def copy(self, suffix: str) -> Path | None:
        """The JVM's file copied into memdiag's private folder, then removed from the JVM's /tmp:
        a regular file of the JVM's user, not a link, at most MAX_RECORDING_BYTES. None where there
        is none, or it was refused (notes say why)."""
        name = self.file(suffix)
        try:
            src = open_in(self.tmp(), name, follow_leaf=False, owner=self.jvm.uid)
        except Unsafe as e:
            self.notes.append(f"the JVM's {self.inside(suffix)} was not read: {e.strerror}")
            self._unlink(suffix)
            return None
        except OSError as e:
            if e.errno != errno.ENOENT:
                self.notes.append(f"the JVM's {self.inside(suffix)} was not read: {e.strerror}")
            return None
        dest = self._private() / f"{os.urandom(16).hex()}.jfr"
        try:
            _copy_bounded(src, dest, MAX_RECORDING_BYTES)
        except OSError as e:
            with contextlib.suppress(OSError):
                dest.unlink()
            self.notes.append(f"the JVM's {self.inside(suffix)} was not read: {e.strerror or e}")
            return None
        finally:
            os.close(src)
            self._unlink(suffix)
        self.copies[suffix] = dest
        return dest

    def close(self) -> None:
        """Stopped (if it was started), every file of memdiag's removed (the JVM's and the private
        copies); never raises."""
        if self.started and not self.stopped:
            try:
                self.stop()
            except (AttachRefused, OSError) as e:
                self.notes.append(f"could not stop the recording {self.name}: {e}")
        for suffix in _SUFFIXES:
            self._unlink(suffix)
        if self.tmp_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.tmp_fd)
            self.tmp_fd = None
        if self.private is not None:
            shutil.rmtree(self.private, ignore_errors=True)
        self.copies.clear()
        with _OPEN_LOCK:
            _OPEN.discard(self)

    def __hash__(self) -> int:
        return hash(self.token)


def _copy_bounded(src: int, dest: Path, max_bytes: int) -> None:
    """src (an open file) into a new file dest, mode 0444 (read by the unprivileged jfr), at most
    max_bytes (Unsafe past it)."""
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    try:
        os.fchmod(out, 0o444)  # whatever the umask (serve's is 077: the tool, as nobody, was refused)
        copied = 0
        while True:
            chunk = os.read(src, COPY_CHUNK)
            if not chunk:
                return
            copied += len(chunk)
            if copied > max_bytes:
                raise Unsafe(errno.EFBIG, f"larger than {max_bytes >> 20} MiB: not copied")
            view = memoryview(chunk)
            while view:
                view = view[os.write(out, view) :]
    finally:
        os.close(out)


def clean_stale(jvm: Jvm) -> list[str]:
    """Stop and remove the recordings, and remove the files, that memdiag processes no longer
    running left in this JVM (killed before their close): found by name (JFR.check, the JVM's
    /tmp), whose pid and start time name a process that is gone. A live memdiag's are never
    touched. What was removed, in words."""
    done: list[str] = []
    try:
        listed = jcmd(jvm, "JFR.check", timeout_s=10).output
    except AttachRefused:
        listed = ""
    for line in listed.splitlines():
        m = _CHECK_LINE.match(line.strip())
        if m and owner_alive(m["name"]) is False:
            with contextlib.suppress(AttachRefused):
                if jcmd(jvm, f"JFR.stop name={m['name']}", timeout_s=30).ok:
                    done.append(f"recording {m['name']} stopped")
    try:
        tmp = open_tmp(jvm)
    except OSError:
        return done
    try:
        for entry in names_in(tmp, "memdiag-"):
            ends = [x for x in sorted(_SUFFIXES, key=len, reverse=True) if entry.endswith("." + x)]
            base = entry.removesuffix("." + ends[0]) if ends else entry
            if base == entry or owner_alive(base) is not False:
                continue
            with contextlib.suppress(OSError):
                if os.stat(entry, dir_fd=tmp, follow_symlinks=False).st_uid == jvm.uid:
                    os.unlink(entry, dir_fd=tmp)
                    done.append(f"/tmp/{entry} removed")
    finally:
        os.close(tmp)
    return done


def _close_all() -> None:
    for r in list(_OPEN):
        r.close()


atexit.register(_close_all)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def print_json(tool: Tool, rec: Recording, suffix: str = "jfr", stack_depth: int = 12) -> str:
    """`jfr print --json` of memdiag's events in memdiag's copy of one of the recording's files
    (RuntimeError with the tool's message on failure). Where a busy allocator's samples pass the
    output's bound, the other events (JFR's old-object samples, at most 256, and the heap summaries)
    are read whole and the allocation samples again with fewer frames each, down to 3."""
    path = rec.copies.get(suffix)
    if path is None:
        raise RuntimeError(f"no copy of the recording's {suffix} to read")
    try:
        return _print(tool, str(path), EVENTS, stack_depth)
    except OutputTooLarge:
        pass
    rest = json.loads(_print(tool, str(path), tuple(e for e in EVENTS if e != ALLOCATION_SAMPLE), stack_depth))
    for depth in (6, 3):
        try:
            samples = json.loads(_print(tool, str(path), (ALLOCATION_SAMPLE,), depth))
        except OutputTooLarge:
            continue
        events = (rest.get("recording") or {}).get("events") or []
        events += (samples.get("recording") or {}).get("events") or []
        return json.dumps({"recording": {"events": events}})
    return json.dumps(rest)  # the allocation samples alone pass the bound at 3 frames: without them


ALLOCATION_SAMPLE = "jdk.ObjectAllocationSample"


def _print(tool: Tool, path: str, events: tuple[str, ...], stack_depth: int) -> str:
    cmd = [tool.path, *TOOL_FLAGS, "print", "--json", "--stack-depth", str(stack_depth), "--events", ",".join(events)]
    try:
        code, out, err = run_confined([*cmd, path])
    except OSError as e:
        raise RuntimeError(f"the jfr tool did not run: {e}") from None
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"the jfr tool failed ({code}): {lines[-1] if lines else ''}")
    return out.decode("utf-8", "replace")
