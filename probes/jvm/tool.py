"""The `jfr` tool memdiag trusts to read a flight recording (jfr.py), never the target's, and how it
runs it.

The tool is $MEMDIAG_JFR (memdiag's own environment, set by the operator), else a JDK of this host's
under /usr/lib/jvm, accepted only where the tool, its JDK and every folder above them belong to root
and are writable by no one else. It runs as nobody (uid and gid 65534, no supplementary groups, no
capabilities, no_new_privs), with a bounded heap and address space, a wall-clock deadline, and its
output read up to a bound: the recording is the target's data, and the tool parses it as hostile
input. With no trusted tool the plan says so and memdiag goes on without a recording (the class
histograms)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import resource
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from memdiag.system.safefile import read_in_root

TOOL_TIMEOUT_S = 60  # the trusted jfr's whole run (it reads a recording here in 0.2-0.6 s)
# `jfr print --json` of memdiag's events: ~6 KB an event with 12 frames (measured here: 2.3 MB for
# 392 events of a 10 s recording of OrderService, 29 allocation samples a second), so 32 MiB is
# ~5,500 events: the default 30 s window even at the throttle's 100 samples a second, plus JFR's
# 256 old-object samples at most. Past it the output is refused with that reason (a long window on
# a fast allocator): memdiag parses it whole, and its memory is bounded by this.
MAX_JSON_BYTES = 32 << 20
MAX_TOOL_ERROR_BYTES = 64 << 10  # the tool's stderr: its last line is what memdiag says

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


class OutputTooLarge(RuntimeError):
    """The tool's output passed memdiag's bound: it was killed, nothing of it kept."""


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
                    raise OutputTooLarge(f"the jfr tool's output passed {max_out >> 20} MiB: not read further")
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
