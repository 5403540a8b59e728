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

The copy is read with a `jfr` tool memdiag trusts, never the target's: $MEMDIAG_JFR (memdiag's own
environment, set by the operator), else a JDK of this host's under /usr/lib/jvm, accepted only
where the tool, its JDK and every folder above them belong to root and are writable by no one
else. It runs as nobody (uid and gid 65534, no supplementary groups, no capabilities,
no_new_privs), with a bounded heap and address space, a wall-clock deadline, and its output read
up to a bound: the recording is the target's data, and the tool parses it as hostile input. With
no trusted tool the plan says so and memdiag goes on without a recording (the class histograms).

What stays in the JVM is what any jcmd leaves: its attach listener thread and socket, and JFR's
threads once JFR has started (JFR Recorder Thread, JFR Periodic Tasks), idle."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import os
import re
import resource
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.system.process import start_ticks
from memdiag.system.safefile import Unsafe, names_in, open_in, read_in_root

from .attach import AttachRefused, Jvm, jcmd, open_tmp, start_listener

MID = "mid.jfr"  # the dump of the recording at its first look (Recording.dump)
# Self-stop margin: the JVM stops the recording itself this long after the time memdiag planned.
# Short, so that a memdiag killed mid-recording leaves it running seconds, not a minute; long
# enough for memdiag's own stop, which comes at the planned time (JFR.stop 15-50 ms here) after a
# start that may be late by the JVM's first JFR start (~1-2 s cold). JFR has no command to extend
# a running recording's duration, so it is not renewed: it is short from the start.
SELF_STOP_MARGIN_S = 5
TOOL_TIMEOUT_S = 60  # the trusted jfr's whole run (it reads a recording here in 0.2-0.6 s)
# A recording's file, copied from the JVM's /tmp: with disk=false the JVM keeps it in JFR's global
# buffers (memorysize, 10 MB by default), so its dump is about that; 64 MiB leaves room for a JVM
# run with larger buffers and refuses a file the target grew or replaced.
MAX_RECORDING_BYTES = 64 << 20
# `jfr print --json` of memdiag's events: ~6 KB an event with 12 frames (measured here: 2.3 MB for
# 392 events of a 10 s recording of OrderService, 29 allocation samples a second), so 32 MiB is
# ~5,500 events: the default 30 s window even at the throttle's 100 samples a second, plus JFR's
# 256 old-object samples at most. Past it the output is refused with that reason (a long window on
# a fast allocator): memdiag parses it whole, and its memory is bounded by this.
MAX_JSON_BYTES = 32 << 20
MAX_TOOL_ERROR_BYTES = 64 << 10  # the tool's stderr: its last line is what memdiag says
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


# --- the jfr tool memdiag trusts: the host's, never the target's ------------------------------------

JFR_ENV = "MEMDIAG_JFR"  # the operator's choice of jfr tool, from memdiag's own environment
HOST_JDKS = Path("/usr/lib/jvm")
NOBODY = 65534  # the tool's uid and gid: no file of anyone's but what is world-readable
NO_TRUSTED_JFR = (
    "no trusted jfr on this host: install a JDK's jfr (openjdk-17-jdk-headless) or set MEMDIAG_JFR "
    "(memdiag never runs the target's own)"
)
# The tool's JVM: a bounded heap, metaspace and code cache, C1 only (a short run), no counters file.
TOOL_FLAGS = (
    "-J-XX:-UsePerfData",
    "-J-Xmx256m",
    "-J-XX:MaxMetaspaceSize=128m",
    "-J-XX:CompressedClassSpaceSize=64m",
    "-J-XX:ReservedCodeCacheSize=64m",
    "-J-XX:TieredStopAtLevel=1",
    "-J-Xss1m",
)
# Its address space: with TOOL_FLAGS OpenJDK 17's and Temurin 25's jfr reserve 1.1-1.5 GiB (1 GiB
# fails to start); 2 GiB caps what a hostile recording can make it commit.
TOOL_ADDRESS_SPACE = 2 << 30
TOOL_NICE = 10
# Nothing of memdiag's environment (JAVA_TOOL_OPTIONS). MALLOC_ARENA_MAX: glibc gives each thread
# that allocates an arena of its own, 64 MiB of address space each, and the JVM's threads grow with
# the host's cores: on a large host they alone would pass TOOL_ADDRESS_SPACE.
TOOL_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
_PR_SET_NO_NEW_PRIVS = 38
_MAX_RELEASE = 64 << 10  # a JDK's release file: ~1-2 KB


@dataclass(frozen=True)
class Tool:
    """A jfr tool memdiag trusts: its real path, its JDK's feature version, and how it was found."""

    path: str
    feature: int | None
    how: str


def untrusted(path: str | Path) -> str | None:
    """Why this file may not be run as memdiag's jfr (None: it may): after its links are resolved,
    it and every folder above it must belong to root and be writable by no one else, and so every
    file of its JDK (bin/..), whose libraries and modules it loads."""
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except OSError as e:
        return f"{real}: {e.strerror}"
    if not os.path.isfile(real) or not st.st_mode & 0o111:
        return f"{real} is not an executable file"
    why = _root_only(real, ancestors=True)
    if why:
        return why
    home = real.parent.parent
    seen: set[Path] = set()
    for d, dirs, files in os.walk(home):
        for entry in [*dirs, *files]:
            p = Path(d) / entry
            why = _root_only(p)
            if why:
                return why
            if p.is_symlink():  # a JDK's links (Debian's conf into /etc): where they lead is checked too
                target = Path(os.path.realpath(p))
                if target.exists() and target not in seen:
                    seen.add(target)
                    why = _root_only(target, ancestors=True)
                    if why:
                        return why
    return None


def _root_only(path: Path, ancestors: bool = False) -> str | None:
    """None where path (and, with ancestors, each folder above it) is root's and writable by root
    alone; else which one is not."""
    for p in [path, *(path.parents if ancestors else ())]:
        try:
            st = os.lstat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        if st.st_uid != 0:
            return f"{p} belongs to uid {st.st_uid}, not root"
        if st.st_mode & 0o022 and not os.path.islink(p):
            return f"{p} is writable by its group or by all (mode {st.st_mode & 0o7777:o})"
    return None


def feature_of(version: str | None) -> int | None:
    """A Java version's feature number: "17.0.15" -> 17, "1.8.0_392" -> 8, "25" -> 25."""
    m = re.match(r"^(\d+)(?:\.(\d+))?", version or "")
    if not m:
        return None
    major = int(m[1])
    return int(m[2]) if major == 1 and m[2] else major


def _jdk_feature(home: Path) -> int | None:
    data = read_in_root("/", str(home / "release"), _MAX_RELEASE, follow_leaf=False)
    text = (data or b"").decode("utf-8", "replace")
    m = re.search(r'^JAVA_VERSION="?([^"\n]*)', text, re.M)
    return feature_of(m[1]) if m else None


def trusted_jfr(feature: int | None = None, environ=None, jdks: Path = HOST_JDKS) -> tuple[Tool | None, str]:
    """The jfr memdiag runs to read a recording, found from this host alone, never from the target:
    $MEMDIAG_JFR, else the JDKs under /usr/lib/jvm (of those root alone may change, the one of
    the lowest feature version at least the target's `feature`, else the newest). (None, why)
    where there is none."""
    env = os.environ if environ is None else environ
    chosen = env.get(JFR_ENV)
    if chosen:
        why = untrusted(chosen)
        if why:
            return None, f"{JFR_ENV}={chosen} is not run: {why}"
        real = os.path.realpath(chosen)
        f = _jdk_feature(Path(real).parent.parent)
        return Tool(real, f, f"{real} ({JFR_ENV})"), f"{real} ({JFR_ENV})"
    found: dict[str, int | None] = {}
    refused: list[str] = []
    try:
        homes = sorted(jdks.iterdir())
    except OSError:
        homes = []
    for home in homes:
        tool = home / "bin" / "jfr"
        if not tool.exists():
            continue
        real = os.path.realpath(tool)
        if real in found:
            continue
        why = untrusted(real)
        if why:
            refused.append(why)
            continue
        found[real] = _jdk_feature(Path(real).parent.parent)
    if not found:
        extra = f" (refused: {'; '.join(refused[:2])})" if refused else ""
        return None, NO_TRUSTED_JFR + extra
    ranked = sorted(found.items(), key=lambda kv: (kv[1] or 0, kv[0]))
    fit = [kv for kv in ranked if feature is not None and (kv[1] or 0) >= feature]
    path, f = fit[0] if fit else ranked[-1]
    how = f"{path} (this host's JDK {f or '?'})"
    if feature is not None and (f or 0) < feature:
        how += f", older than the target's {feature}: it may not read the recording"
    return Tool(path, f, how), how


_LIBC = None


def _confine() -> None:
    """In the tool's child, after its ids became nobody's (Popen user/group/extra_groups): no
    privilege regained through exec (no_new_privs), a bounded address space, no core file, niced.
    It runs between fork and exec in a process that may have other threads (serve, the sampler):
    C calls only, nothing imported here (the import lock may be held by a thread that is gone)."""
    _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # type: ignore[union-attr]
    resource.setrlimit(resource.RLIMIT_AS, (TOOL_ADDRESS_SPACE, TOOL_ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    # only ever niced further: nobody may not lower a niceness, and memdiag may already run past
    # TOOL_NICE (its own os.nice(10) under `nice`, serve's worker thread under systemd's Nice=10)
    os.setpriority(os.PRIO_PROCESS, 0, max(TOOL_NICE, os.getpriority(os.PRIO_PROCESS, 0)))


def run_confined(
    argv: list[str], timeout_s: float = TOOL_TIMEOUT_S, max_out: int = MAX_JSON_BYTES
) -> tuple[int, bytes, bytes]:
    """argv run as nobody, confined (_confine), in its own session; (exit status, stdout, the tail
    of stderr). RuntimeError past the deadline or past max_out bytes of output (the child killed)."""
    global _LIBC
    if _LIBC is None:
        _LIBC = ctypes.CDLL(None, use_errno=True)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env=TOOL_ENV,
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        preexec_fn=_confine,
        close_fds=True,
        start_new_session=True,
    )
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)  # type: ignore[arg-type]
    sel.register(proc.stderr, selectors.EVENT_READ, err)  # type: ignore[arg-type]
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"the jfr tool did not finish within {timeout_s:.0f} s: stopped")
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                key.data.extend(chunk)
                if key.data is out and len(out) > max_out:
                    raise RuntimeError(f"the jfr tool's output passed {max_out >> 20} MiB: not read further")
                if key.data is err and len(err) > MAX_TOOL_ERROR_BYTES:
                    del err[: len(err) - MAX_TOOL_ERROR_BYTES]
        code = proc.wait(max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the jfr tool did not finish within {timeout_s:.0f} s: stopped") from None
    finally:
        sel.close()
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    return code, bytes(out), bytes(err)


def print_json(tool: Tool, rec: Recording, suffix: str = "jfr", stack_depth: int = 12) -> str:
    """`jfr print --json` of memdiag's events in memdiag's copy of one of the recording's files
    (RuntimeError with the tool's message on failure)."""
    path = rec.copies.get(suffix)
    if path is None:
        raise RuntimeError(f"no copy of the recording's {suffix} to read")
    cmd = [
        tool.path,
        *TOOL_FLAGS,
        "print",
        "--json",
        "--stack-depth",
        str(stack_depth),
        "--events",
        ",".join(EVENTS),
        str(path),
    ]
    try:
        code, out, err = run_confined(cmd)
    except OSError as e:
        raise RuntimeError(f"the jfr tool did not run: {e}") from None
    if code != 0:
        lines = err.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"the jfr tool failed ({code}): {lines[-1] if lines else ''}")
    return out.decode("utf-8", "replace")
