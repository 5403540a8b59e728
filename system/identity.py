"""A target process is a process, not a number: what memdiag holds of the process it resolved, and
the one check every probe, attach, price, ptrace stop and read of /proc/PID/mem makes first.

A pid names whichever process holds it now. The target may exit and another process take its
number (the host wraps around pid_max; a pid namespace hands out numbers an attacker can choose
with ns_last_pid), or the target may exec another program (the same process, a new image: the old
image's memory is gone). Seen before this module: memdiag priced, uprobed, ptrace-stopped and
scanned the newcomer for 12 s and named its function under the old target's name.

At resolution (diagnose/target.py) memdiag holds, per (pid, start ticks):
  - a pidfd (pidfd_open(2), 5.3+): the kernel's handle on that very process, never on a newcomer.
    poll() says readable once the process has exited, so "not readable" means the process is alive
    and so still holds its pid (a pid is freed only when its zombie is reaped);
  - the executable's identity, (st_dev, st_ino) of /proc/PID/exe (os.stat follows the magic link
    to the file without reading the link's text): exec of another program changes it;
  - the image's fingerprint, start_code and start_stack of /proc/PID/stat (fields 26 and 28): exec
    of the same program (a re-exec) gives a new address space at a new random base (ASLR). Where
    ASLR is off a re-exec of the same file goes unnoticed: said, not guessed at.
The process's comm is not part of it: a program renames itself at will (prctl PR_SET_NAME), and an
exec of the same file keeps it.

changed(target) answers with a Change (exited, exec'd, or exited with its pid reused) or None,
at the cost of one poll, one stat and one read of /proc/PID/stat (measured here: 0.3 + 1.2 + 4 us).
A change is sticky: the first one seen is the one every later check returns, with the time it was
seen. check_pid(pid) asks the same of every held identity of that pid number, for the readers that
only know a pid (the probes' attach, the memory readers). open_mem(pid) opens /proc/PID/mem and
then checks: the descriptor is bound to the process it was opened on, so a check that passes after
the open proves every read through it is of the target (or of its own old image, after an exec).

Each resolution holds (hold), each diagnosis ends by releasing (diagnose/workflow.py): the pidfd is
closed with the last. At most MAX_HELD are held at once (serve resolves targets it may never
diagnose: the oldest pidfd is closed first, its identity then checked by start ticks). The
processes of a cgroup target are not held: their cgroup's membership is what the probes follow."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from . import clock

MAX_HELD = 256  # pidfds held at once: serve's concurrent diagnoses are a handful; a bound all the same
EXE_SHOWN = 200  # characters of a new executable's path kept for the report (the name is the target's)

ChangeKind = Literal["exited", "execd", "reused"]


@dataclass(frozen=True)
class Change:
    """How the process memdiag resolved stopped being the target: it exited (its pid maybe
    already another process's: reused), or it exec'd another image (exe: the new executable)."""

    kind: ChangeKind
    pid: int
    at: float  # seconds since the epoch, when memdiag saw it
    exe: str | None = None

    @property
    def exited(self) -> bool:
        return self.kind in ("exited", "reused")

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.gmtime(self.at))
        if self.kind == "execd":
            return f"the target (PID {self.pid}) exec'd {self.exe or 'another program'} at {when} UTC"
        if self.kind == "reused":
            return f"the target (PID {self.pid}) exited at {when} UTC and its pid now belongs to another process"
        return f"the target (PID {self.pid}) exited at {when} UTC"


class TargetChanged(OSError):
    """The target is not the process memdiag resolved any more: an OSError (ESRCH, as for a process
    gone), so every reader that already degrades on a vanished process degrades the same way."""

    def __init__(self, change: Change):
        super().__init__(errno.ESRCH, change.describe())
        self.change = change


@dataclass
class _Held:
    pid: int
    start_ticks: int | None
    pidfd: int | None
    exe: tuple[int, int] | None
    image: tuple[int, int] | None  # (start_code, start_stack)
    change: Change | None = None
    users: int = 0  # diagnoses holding it (hold() with user=True); checks alone hold nothing


_lock = threading.Lock()
_held: OrderedDict[tuple[int, int | None], _Held] = OrderedDict()


def _stat_fields(pid: int) -> tuple[str, int | None, tuple[int, int] | None] | None:
    """(state, start ticks, (start_code, start_stack)) from /proc/PID/stat; None: no such process."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    rest = text[text.rfind(b")") + 2 :].split()  # comm may hold spaces and ')': after the last one

    def field(n: int) -> int | None:  # field n of proc(5), counted from 1
        try:
            return int(rest[n - 3])
        except (IndexError, ValueError):
            return None

    if not rest:
        return None
    code, stack = field(26), field(28)
    return rest[0].decode(), field(22), (code, stack) if code is not None and stack is not None else None


def _exe(pid: int) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file /proc/PID/exe leads to; None where it leads nowhere (a kernel
    thread, a process exiting, a leader that ended with pthread_exit)."""
    try:
        st = os.stat(f"/proc/{pid}/exe")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _exe_path(pid: int) -> str | None:
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    return path[:EXE_SHOWN]


def _pidfd(pid: int) -> int | None:
    """A pidfd of the process holding pid now; None where the kernel has none (before 5.3) or
    refuses (ESRCH: gone; the caller finds that out from /proc)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        return opener(pid)
    except OSError:
        return None


def _exited(pidfd: int) -> bool | None:
    """The pidfd's process has exited (readable: a zombie or reaped); None: the descriptor is not
    open any more (released meanwhile: the caller goes by the start time instead)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    events = poller.poll(0)
    if events and events[0][1] & select.POLLNVAL:
        return None
    return bool(events)


def hold(
    pid: int, start_ticks: int | None = None, exe: tuple[int, int] | None = None, user: bool = True
) -> tuple[int, int] | None:
    """Hold the identity of the process with this pid and start time (None: whichever holds the pid
    now); exe: its executable's identity as seen at resolution, when it was. Returns the executable's
    identity held. Raises TargetChanged when that process is already gone or another image. user:
    counted as one more diagnosis using it (each release() ends one; the pidfd closes with the last)."""
    key = (pid, start_ticks)
    with _lock:
        held = _held.get(key)
    if held is None:
        new = _new(pid, start_ticks, exe)
        with _lock:
            held = _held.setdefault(key, new)
            _bound()
        if held is not new and new.pidfd is not None:  # another thread held it first
            os.close(new.pidfd)
    if user:
        with _lock:
            held.users += 1
    change = _check(held)
    if change is not None:
        raise TargetChanged(change)
    return held.exe


def _new(pid: int, start_ticks: int | None, exe: tuple[int, int] | None) -> _Held:
    pidfd = _pidfd(pid)
    held = _Held(pid, start_ticks, pidfd, exe, None)
    # read after the pidfd is open: if the start time read now is the one resolved, the pidfd is of
    # that process (a pid is not given to a newcomer while its holder lives)
    fields = _stat_fields(pid)
    now = _exe(pid)
    if fields is None or fields[0] in ("Z", "X") or (pidfd is not None and _exited(pidfd)):
        held.change = Change("exited", pid, clock.wall())
    elif start_ticks is not None and fields[1] != start_ticks:
        held.change = Change("reused", pid, clock.wall())
    else:
        held.start_ticks, held.image = fields[1], fields[2] if _known(fields[2]) else None
        if exe is not None and now is not None and now != exe:
            held.change = Change("execd", pid, clock.wall(), _exe_path(pid))
        held.exe = exe or now
    if held.change is not None and pidfd is not None:
        os.close(pidfd)
        held.pidfd = None
    return held


def _bound() -> None:
    """At most MAX_HELD pidfds (called with the lock): the oldest goes first, and its identity is
    then checked by its start ticks (a reuse within the same clock tick would go unseen)."""
    open_fds = [h for h in _held.values() if h.pidfd is not None]
    for h in open_fds[: max(0, len(open_fds) - MAX_HELD)]:
        os.close(h.pidfd)  # type: ignore[arg-type]
        h.pidfd = None
    while len(_held) > 4 * MAX_HELD:  # the identities themselves: a few hundred bytes each
        _key, oldest = _held.popitem(last=False)
        if oldest.pidfd is not None:
            os.close(oldest.pidfd)


def _check(held: _Held) -> Change | None:
    """The held process now: None while it is the same one, else the first change seen."""
    if held.change is not None:
        return held.change
    pid, pidfd = held.pid, held.pidfd
    gone = _exited(pidfd) if pidfd is not None else None
    if gone is None:  # no pidfd (or closed meanwhile): /proc/PID/stat's start time decides alone
        pidfd = None
    fields = None if gone else _stat_fields(pid)
    # a zombie leader (its other threads may live on after pthread_exit) counts as gone, as it
    # always has here: its /proc/PID/mem and maps are empty, nothing of it can be read
    if fields is None or fields[0] in ("Z", "X"):
        now = _stat_fields(pid)  # who holds the pid now: a newcomer says it was reused
        kind: ChangeKind = "reused" if now is not None and now[1] != held.start_ticks else "exited"
        change = Change(kind, pid, clock.wall())
    elif fields[1] != held.start_ticks:  # no pidfd on this kernel: the start time tells
        change = Change("reused", pid, clock.wall())
    else:
        exe = _exe(pid)
        new_exe = exe is not None and held.exe is not None and exe != held.exe
        new_image = _known(fields[2]) and _known(held.image) and fields[2] != held.image
        if not (new_exe or new_image):
            return None
        path = _exe_path(pid)
        if pidfd is not None and _exited(pidfd):  # it exited meanwhile: what was read was a newcomer's
            change = Change("exited", pid, clock.wall())
        else:
            change = Change("execd", pid, clock.wall(), path)
    with _lock:
        if held.change is None:
            held.change = change
        return held.change


def _known(image: tuple[int, int] | None) -> bool:
    """An image fingerprint the kernel showed: zeros where the process has no memory of its own
    (a leader that ended with pthread_exit) or the reader may not see it (ptrace access refused)."""
    return image is not None and all(image)


def _of(target, hold_now: bool = True) -> _Held | None:
    """The held identity of a pid target (hold_now: held now if it was not: a target made without
    resolution, e.g. Target.for_pid, is the process holding its pid at its first check)."""
    if getattr(target, "kind", None) != "pid" or target.pid is None:
        return None
    key = (target.pid, target.start_ticks)
    with _lock:
        held = _held.get(key)
    if held is not None or not hold_now:
        return held
    with contextlib.suppress(TargetChanged):  # the change is held too: changed() answers with it
        hold(target.pid, target.start_ticks, getattr(target, "exe_id", None), user=False)
    with _lock:
        return _held.get(key)


def changed(target, hold_now: bool = True) -> Change | None:
    """None while a pid target is the process memdiag resolved; else how it changed. Other
    targets (a cgroup, the system) never change here. hold_now=False: only a target whose
    identity is held already (resolved) is checked."""
    held = _of(target, hold_now)
    return _check(held) if held is not None else None


def check(target) -> None:
    """Raise TargetChanged unless the target is the process memdiag resolved."""
    change = changed(target)
    if change is not None:
        raise TargetChanged(change)


def check_pid(pid: int) -> Change | None:
    """For a reader that knows only a pid: None when a held identity of that pid is still the same
    process (or none is held: not a target of this check), else the change seen. At most one
    process holds a pid at a time, so one unchanged identity is enough."""
    with _lock:
        helds = [h for h in _held.values() if h.pid == pid]
    if not helds:
        return None
    changes = [_check(h) for h in helds]
    if any(c is None for c in changes):
        return None
    return max(changes, key=lambda c: c.at)  # type: ignore[union-attr,return-value]


def verify_pid(pid: int) -> None:
    change = check_pid(pid)
    if change is not None:
        raise TargetChanged(change)


def open_mem(pid: int, flags: int = os.O_RDONLY | os.O_CLOEXEC) -> int:
    """/proc/PID/mem opened, then checked: a descriptor of the target's memory, or TargetChanged
    (closed) when the process it was opened on is not the target. The open binds the descriptor to
    that process's memory, so the check after it covers every read through it."""
    fd = os.open(f"/proc/{pid}/mem", flags)
    change = check_pid(pid)
    if change is not None:
        os.close(fd)
        raise TargetChanged(change)
    return fd


def sleep(target, seconds: float) -> bool:
    """Sleep up to seconds, ending at once when a held pid target exits (its pidfd turns
    readable). True when it exited (or had)."""
    held = _of(target)
    pidfd = held.pidfd if held is not None else None
    if pidfd is None:
        time.sleep(seconds)
        return held is not None and held.change is not None
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    events = poller.poll(max(0, int(seconds * 1000)))
    if events and events[0][1] & select.POLLNVAL:  # released meanwhile: a plain sleep, the caller checks
        time.sleep(seconds)
        return False
    return bool(events)


def release(target) -> None:
    """One diagnosis of a pid target ended: with the last, what memdiag held of it is closed."""
    if getattr(target, "kind", None) != "pid" or target.pid is None:
        return
    key = (target.pid, target.start_ticks)
    with _lock:
        held = _held.get(key)
        if held is None:
            return
        held.users -= 1
        if held.users > 0:
            return
        del _held[key]
    if held.pidfd is not None:
        os.close(held.pidfd)


def release_all() -> None:
    with _lock:
        helds = list(_held.values())
        _held.clear()
    for h in helds:
        if h.pidfd is not None:
            os.close(h.pidfd)


def held_count() -> int:
    """pidfds held now (tests: nothing is left open after a diagnosis)."""
    with _lock:
        return sum(1 for h in _held.values() if h.pidfd is not None)
