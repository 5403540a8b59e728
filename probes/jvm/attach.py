"""HotSpot's attach protocol spoken by memdiag itself (what jcmd and async-profiler's jattach do),
so that no JVM of memdiag's own starts beside the target (jcmd's takes ~0.3 s and ~40 MiB).

The JVM's attach listener is started on demand: a file `.attach_pid<pid>` in the JVM's working
directory or its /tmp, owned by the JVM's user (or root), and SIGQUIT; the JVM's signal thread then
creates the listener's socket `/tmp/.java_pid<pid>` (mode 0600) and keeps it until it exits (jcmd
leaves it the same way: the listener is the JVM's). A client connects, the JVM checks the peer's
uid and gid (SO_PEERCRED) against its own effective ones (or root), and reads a request of
NUL-terminated strings: protocol version "1", the operation ("jcmd"), three arguments (the
command line, then two empty ones); it answers a status line ("0" is done) and the command's
output, then closes. <pid> is the JVM's pid in its own pid namespace; the paths are the JVM's own.

Every file of it is reached through a descriptor of the JVM's /tmp opened inside the JVM's own root
(memdiag.system.safefile: its symlinks resolve inside that root, never to the host's files), and
named from there (dir_fd) without following a link: the trigger is created there (O_EXCL), the
socket opened there (O_PATH, a socket owned by the JVM's user, or refused). Only /tmp: HotSpot looks
for the trigger in its working directory first, then in /tmp, so /tmp alone serves and memdiag never
creates a file in a directory the target chose by its chdir. A reply is bounded in bytes
(MAX_REPLY_BYTES) and in time (one deadline for the whole exchange, not one per read): a listener
that never stops answering costs memdiag that much and no more.

Safety, checked before any signal (`check`): SIGQUIT terminates a process that does not catch it,
so it is sent only to a process that maps HotSpot's libjvm.so, catches SIGQUIT (SigCgt; -Xrs
leaves it uncaught) and was not started with -XX:+DisableAttachMechanism (its counters say so too:
sun.rt.jvmCapabilities), and only when no socket is there already (-Xrs starts the listener at
start-up). The trigger file is removed whatever happens. The socket is reached through an O_PATH
descriptor and connected to from a thread whose own credentials are the JVM's user's (raw
setresuid/setresgid change one thread; glibc's wrappers change every thread), so a JVM in a user
namespace sees its own uid."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from memdiag.system import identity
from memdiag.system.arch import syscall_number
from memdiag.system.hsperfdata import read_perfdata, read_proc_args
from memdiag.system.jvm import jvm_counters, read_jvm_library
from memdiag.system.process import effective_ids, innermost_pid, start_ticks
from memdiag.system.safefile import open_dir_in, open_root

PROTOCOL = b"1"
WAIT_FOR_LISTENER_S = 5.0  # jattach waits ~6 s in growing steps; a loaded JVM answers in tens of ms
ARG_MAX = 1024  # the listener refuses an argument longer than this (AttachOperation::arg_length_max)
# The longest reply read: GC.class_histogram is the longest memdiag asks for, ~100 bytes a class,
# so 16 MiB holds a histogram of 150,000 classes (a large application server has ~30,000). Past it
# the reply is refused, not cut: a histogram cut short would name the wrong classes.
MAX_REPLY_BYTES = 16 << 20
RECV_BYTES = 65536
_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


# What the report says of a listener memdiag started (jfr's and histogram's caveats)
LISTENER_STARTED = (
    "memdiag started the JVM's attach listener (SIGQUIT with its trigger file): its thread and socket "
    "(/tmp/.java_pid<pid>) stay for the JVM's life, as after any jcmd"
)


class AttachRefused(Exception):
    """memdiag will not (or could not) speak to this JVM; the message says why, in one sentence."""


@dataclass(frozen=True)
class Jvm:
    """What attaching to one JVM needs: where its files are and as whom to speak to it."""

    pid: int  # the host's (memdiag's namespace's) pid: the one signalled
    nspid: int  # the JVM's own pid, which names its files
    uid: int  # its effective uid and gid, as this host numbers them
    gid: int
    start_ticks: int | None  # tells the same process from a reused pid before a signal
    proc: Path  # /proc/PID

    @property
    def socket_name(self) -> str:
        return f".java_pid{self.nspid}"

    @property
    def trigger_name(self) -> str:
        return f".attach_pid{self.nspid}"


def open_tmp(jvm: Jvm) -> int:
    """A descriptor of the JVM's /tmp, opened inside the JVM's root (OSError where it has none)."""
    root = open_root(jvm.proc / "root")
    try:
        return open_dir_in(root, "/tmp")
    finally:
        os.close(root)


@contextlib.contextmanager
def jvm_tmp(jvm: Jvm):
    """open_tmp for a `with` block, closed after it."""
    fd = open_tmp(jvm)
    try:
        yield fd
    finally:
        os.close(fd)


def _status_field(status: str, key: str) -> list[str]:
    line = next((x for x in status.splitlines() if x.startswith(key + ":")), "")
    return line.split()[1:]


def jvm_options(pid: int, proc_root: Path = Path("/proc")) -> list[str]:
    """The JVM's options as it was given them: its command line and the environment variables
    the launcher and the JVM read (JAVA_TOOL_OPTIONS, JDK_JAVA_OPTIONS, _JAVA_OPTIONS)."""
    base = proc_root / str(pid)
    words: list[str] = []
    words += [w for w in (read_proc_args(base / "cmdline") or b"").decode("utf-8", "replace").split("\0") if w]
    for entry in (read_proc_args(base / "environ") or b"").decode("utf-8", "replace").split("\0"):
        key, _, value = entry.partition("=")
        if key in _OPTION_VARIABLES:
            words += value.split()
    return words


def refusal(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """Why memdiag must not attach to this process, or None. Never signals anything."""
    lib = read_jvm_library(pid, proc_root)
    if lib is None:
        return f"PID {pid} is not a HotSpot JVM (it maps no libjvm.so; OpenJ9 and other VMs speak other protocols)"
    opts = jvm_options(pid, proc_root)
    perf = read_perfdata(pid, proc_root)
    counters = jvm_counters(perf) if perf is not None else None
    disabled = "-XX:+DisableAttachMechanism" in opts or (counters is not None and counters.attach_supported is False)
    if counters is not None and counters.vm_args and "-XX:+DisableAttachMechanism" in counters.vm_args.split():
        disabled = True
    if disabled:
        return "the JVM runs with -XX:+DisableAttachMechanism: it accepts no attach (its counters are still read)"
    return None


def describe_target(pid: int, proc_root: Path = Path("/proc")) -> Jvm:
    """The JVM's pid in its namespace, its user and start time; AttachRefused when it is not one
    to attach to (refusal) or is gone."""
    why = refusal(pid, proc_root)
    if why is not None:
        raise AttachRefused(why)
    proc = proc_root / str(pid)
    try:
        status = (proc / "status").read_text()
    except OSError:
        raise AttachRefused(f"PID {pid} is gone") from None
    ids = effective_ids(status)
    if ids is None:
        raise AttachRefused(f"PID {pid}: its status has no Uid/Gid line")
    return Jvm(
        pid=pid,
        nspid=innermost_pid(status) or pid,
        uid=ids[0],
        gid=ids[1],
        start_ticks=start_ticks(pid, proc_root),
        proc=proc,
    )


def catches_sigquit(jvm: Jvm) -> bool:
    """SIGQUIT has a handler in the process (SigCgt): the JVM's, which starts the listener; a
    process that does not catch it (-Xrs, a JVM still starting) would be killed by it."""
    try:
        status = (jvm.proc / "status").read_text()
    except OSError:
        return False
    mask = _status_field(status, "SigCgt")
    return bool(mask) and bool(int(mask[0], 16) >> (signal.SIGQUIT - 1) & 1)


def listener_running(jvm: Jvm) -> bool:
    """The JVM's socket is there, a socket (not a link to one), and owned by the JVM's user."""
    try:
        with jvm_tmp(jvm) as tmp:
            st = os.stat(jvm.socket_name, dir_fd=tmp, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and st.st_uid == jvm.uid


def start_listener(jvm: Jvm, wait_s: float = WAIT_FOR_LISTENER_S) -> bool:
    """Make sure the JVM's attach listener runs: True when its socket was there already (no
    signal sent), False when memdiag started it. AttachRefused when it may not or did not start."""
    if listener_running(jvm):
        return True
    if not catches_sigquit(jvm):
        raise AttachRefused(
            "the JVM does not catch SIGQUIT (started with -Xrs or -XX:+ReduceSignalUsage, or still starting) "
            "and has no attach socket: a signal would end it, so none was sent"
        )
    try:
        tmp = open_tmp(jvm)
    except OSError as e:
        raise AttachRefused(f"cannot reach the JVM's /tmp inside its root: {e.strerror}") from None
    try:
        _create_trigger(jvm, tmp)
        try:
            _signal_the_same_jvm(jvm, signal.SIGQUIT)
            deadline, step = time.monotonic() + wait_s, 0.02
            while time.monotonic() < deadline:
                time.sleep(step)
                if listener_running(jvm):
                    return False
                step = min(step + 0.02, 0.2)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(jvm.trigger_name, dir_fd=tmp)
    finally:
        os.close(tmp)
    raise AttachRefused(f"the JVM started no attach listener within {wait_s:.0f} s of SIGQUIT")


def _signal_the_same_jvm(jvm: Jvm, sig: int) -> None:
    """sig sent to the JVM memdiag resolved, never to whatever holds its pid now: a pidfd taken
    first pins the process, then its start time and the diagnosis's identity check (an exec since,
    system/identity.py) are asked, and the signal goes through the pidfd. SIGQUIT ends a program
    that does not catch it."""
    try:
        pidfd = os.pidfd_open(jvm.pid)
    except OSError:
        raise AttachRefused(f"PID {jvm.pid} has exited") from None
    try:
        change = identity.check_pid(jvm.pid)
        if start_ticks(jvm.pid, jvm.proc.parent) != jvm.start_ticks or change is not None:
            why = change.describe() if change is not None else "it exited, or its pid was reused"
            raise AttachRefused(f"PID {jvm.pid} is no longer the JVM it was ({why}): no signal sent")
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        raise AttachRefused(f"PID {jvm.pid} has exited") from None
    finally:
        os.close(pidfd)


def _create_trigger(jvm: Jvm, tmp: int) -> None:
    """The trigger file in the JVM's /tmp (tmp: its descriptor), owned by the JVM's user (the JVM
    ignores one of another user's but root's; in a user namespace, the host's root is nobody)."""
    name = jvm.trigger_name
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=tmp)
    except FileExistsError:
        with contextlib.suppress(OSError):
            if os.stat(name, dir_fd=tmp, follow_symlinks=False).st_uid in (jvm.uid, 0):
                return  # a trigger already there (another tool's): it serves, and is removed after
        raise AttachRefused(f"a file of another user's is in the way of the attach trigger /tmp/{name}") from None
    except OSError as e:
        raise AttachRefused(f"could not create the attach trigger file in the JVM's /tmp: {e.strerror}") from None
    try:
        os.fchown(fd, jvm.uid, jvm.gid)
    except OSError as e:
        os.close(fd)
        os.unlink(name, dir_fd=tmp)
        raise AttachRefused(f"could not give the attach trigger file to the JVM's user: {e.strerror}") from None
    os.close(fd)
    if os.stat(name, dir_fd=tmp, follow_symlinks=False).st_uid != jvm.uid:
        os.unlink(name, dir_fd=tmp)  # some file systems map owners: the JVM would not trust it
        raise AttachRefused("the JVM's /tmp maps file owners: the attach trigger would not be the JVM user's")


_LIBC = ctypes.CDLL(None, use_errno=True)


def _as_user(uid: int, gid: int) -> None:
    """This thread's effective ids become uid/gid (the saved ids stay root's: this thread ends
    right after; no other thread changes)."""
    for name, value in (("setresgid", gid), ("setresuid", uid)):
        nr = syscall_number(name)
        if nr is None:
            raise OSError(f"no {name} system call number known for this machine")
        if _LIBC.syscall(nr, ctypes.c_long(-1), ctypes.c_long(value), ctypes.c_long(-1)) != 0:
            raise OSError(ctypes.get_errno(), f"{name}({value})")


def connect(jvm: Jvm, timeout_s: float) -> socket.socket:
    """A connection to the JVM's listener made as the JVM's user (SO_PEERCRED is taken at connect)."""
    try:
        with jvm_tmp(jvm) as tmp:
            path_fd = os.open(jvm.socket_name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tmp)
    except OSError as e:
        raise AttachRefused(f"cannot open the JVM's attach socket: {e.strerror}") from None
    st = os.fstat(path_fd)
    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != jvm.uid:
        os.close(path_fd)
        raise AttachRefused(f"/tmp/{jvm.socket_name} is no socket of the JVM's user (uid {st.st_uid}): not used")
    box: dict = {}

    def run() -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            _as_user(jvm.uid, jvm.gid)
            sock.settimeout(timeout_s)
            sock.connect(f"/proc/self/fd/{path_fd}")
            box["sock"] = sock
        except OSError as e:
            sock.close()
            box["error"] = e

    try:
        t = threading.Thread(target=run, name="memdiag-attach")
        t.start()
        t.join()
    finally:
        os.close(path_fd)
    if "sock" not in box:
        raise AttachRefused(f"cannot connect to the JVM's attach socket: {box.get('error')}")
    return box["sock"]


def request(command: str) -> bytes:
    """The request for one jcmd command: version, operation, then three arguments."""
    if len(command.encode()) > ARG_MAX or "\0" in command:
        raise ValueError(f"jcmd command too long or malformed: {command[:60]!r}")
    return b"\0".join([PROTOCOL, b"jcmd", command.encode(), b"", b""]) + b"\0"


def parse_reply(data: bytes) -> tuple[int | None, str]:
    """(status, output) of the listener's answer; status None when it sent no status line."""
    head, _, rest = data.partition(b"\n")
    try:
        code = int(head.strip())
    except ValueError:
        return None, data.decode("utf-8", "replace")
    return code, rest.decode("utf-8", "replace")


@dataclass(frozen=True)
class Reply:
    status: int | None
    output: str
    seconds: float  # from the connect to the JVM's close

    @property
    def ok(self) -> bool:
        return self.status == 0


def jcmd(jvm: Jvm, command: str, timeout_s: float = 10.0, max_bytes: int = MAX_REPLY_BYTES) -> Reply:
    """Run one diagnostic command in the JVM (its listener started first if need be). The whole
    exchange ends within timeout_s of the connect and reads at most max_bytes (AttachRefused past
    either: a listener that never stops answering is not the JVM's)."""
    start_listener(jvm)
    started = time.monotonic()
    deadline = started + timeout_s
    what = command.split()[0] if command.split() else "?"
    sock = connect(jvm, timeout_s)
    buf = bytearray()
    try:
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(request(command))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttachRefused(f"the JVM's attach listener did not finish answering {what} within {timeout_s:g} s")
            sock.settimeout(left)
            data = sock.recv(min(RECV_BYTES, max_bytes + 1 - len(buf)))
            if not data:
                break
            buf += data
            if len(buf) > max_bytes:
                raise AttachRefused(f"the JVM's answer to {what} passed {max_bytes >> 20} MiB: not read further")
    except TimeoutError:
        raise AttachRefused(
            f"the JVM's attach listener did not finish answering {what} within {timeout_s:g} s"
        ) from None
    except OSError as e:
        raise AttachRefused(f"the JVM's attach listener did not answer {what}: {e}") from None
    finally:
        sock.close()
    status, output = parse_reply(bytes(buf))
    return Reply(status=status, output=output, seconds=time.monotonic() - started)
