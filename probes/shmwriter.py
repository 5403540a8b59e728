"""shmwriter: who makes the shared memory that accumulates. A file written to tmpfs (/dev/shm, a
container's /tmp) and closed is in no process's RSS, nor is a System V segment once detached, nor a
memfd's pages once its maker only holds the descriptor: the counters name the mount, the pattern and
the bytes, not the process and the code that left them. This probe traces their creation (open,
openat, openat2 and creat with O_CREAT; memfd_create; shmget with IPC_CREAT or IPC_PRIVATE) by the
user stack that made each, with the path, descriptor or shmid that names it, and forgets a file the
same process unlinks. At the end it keeps what is still there: a file still on a tmpfs mount of the
maker's, born while traced (looked up in the view the maker had while traced, below the mount alone,
no link followed), a memfd still open in its maker, a segment
still in /proc/sysvipc/shm; and groups them by where they are (the mount and file name pattern, as
system/tmpfs.py names them; a memfd's name; a segment's key), each with the stacks that made them:
"created 240 of the 262 /dev/shm/job-*.spool files there at its end: PID 812 (spooler) in spool_job".

Raw syscall tracepoints (bpf/shmwriter.c), as fdstack; host-wide, the target filtered inside."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from memdiag.system import arch
from memdiag.system._parse import Model, fs_text, read_text
from memdiag.system.cgroup import on_fuse, parse_mountinfo
from memdiag.system.fds import fd_links
from memdiag.system.safefile import open_dir_in, open_on_mount, open_root, stat_fd
from memdiag.system.sysvshm import ShmSegment, read_sysv_shm
from memdiag.system.tmpfs import MAX_ENTRIES, SHMEM_FSTYPES, name_pattern
from memdiag.system.units import fmt_bytes, fmt_number

from . import bpfstats, hostwide, kernel
from .base import Run, run_probe
from .face import Face, FactDef, Option, ProbeResult, Section, Stack, Stacks
from .growth import EventStacks, RawStack, StackGrowth
from .text import stack_lines

METHOD = "raw tracepoint sys_exit (open/openat/creat with O_CREAT, memfd_create, shmget, unlink), user stacks"
MAX_MADE = 16_384  # things made and not unlinked that its table holds (the program's MAX_MADE)
PATH_BYTES = 160  # SHMW_PATH of bpf/memdiag.h: a path this long (its NUL included) may be cut
AT_FDCWD = -100
TOP_PLACES = 8
OPEN_FOLDERS = 64  # folders' descriptors kept open while the files made are looked up
# enum shmw_kind of bpf/memdiag.h, in its order (tests/unit/test_shmwriter.py checks that they agree)
KINDS = ("file", "memfd", "sysv")
NOUNS = {"file": "files", "memfd": "memfds", "sysv": "System V segments"}
NOT_TRACED = (
    "shmwriter sees what was made while it ran, by open, openat, openat2 and creat with O_CREAT, memfd_create "
    "and shmget; not files made before it started, by rename or link, by mkstemp's kin through O_TMPFILE, nor "
    "a file another process writes into; a file opened with O_CREAT that existed already is not counted as made "
    "(its birth time, before the trace began, tells it; a file made by another process during the trace and "
    "then opened with O_CREAT by the target still counts as the target's); a memfd only mapped after its "
    "descriptor was closed counts as gone"
)


class Made(Model):
    """One thing the table holds at the end: what the target made and did not unlink, as traced."""

    kind: str  # KINDS
    pid: int
    key: tuple  # its stack key in the program's books
    path: str = ""  # a file's path (absolute, as its maker sees its root) or a memfd's name; "" for a segment
    id: int = 0  # a memfd's descriptor, a segment's shmid
    ipc_key: int = 0
    size: int = 0
    cut: bool = False  # its path was longer than the program keeps: never matched


class There(Model):
    """What is still there of one thing made: where it is (its pattern, name or key) and its bytes."""

    where: str
    bytes: int
    mount: str | None = None  # a file's tmpfs mount point


class WriterStack(StackGrowth):
    """One making stack of one kind (count: its things still there at the end; bytes: theirs)."""

    kind: str
    comm: str = ""
    created: int
    removed: int  # files it made that the same process unlinked while traced
    remaining: int
    where: str = ""  # where most of its remaining things are


class Place(Model):
    """Where made things are still there at the end: a tmpfs file pattern, a memfd name, a segment key."""

    where: str
    kind: str
    mount: str | None = None
    remaining: int  # made while traced and still there
    bytes: int
    there: int | None = None  # files of the pattern on the mount at the end, made while traced or not
    pid: int | None = None  # the process of the stack that made most of them
    comm: str = ""
    frames: list[str] = []  # that stack
    stack_remaining: int = 0  # how many of them that stack made


class WriterResult(ProbeResult):
    stacks: list[WriterStack] = []
    folded: list[str] = []
    places: list[Place] = []
    pattern: str | None = None  # the place the diagnosis asked about (a pattern that grew)
    created: int = 0
    removed: int = 0
    remaining: int = 0
    remaining_bytes: int = 0
    unmatched: int = 0  # made, not unlinked while traced, and gone at the end (or not on tmpfs)
    cut: int = 0  # paths longer than the program keeps: not matched
    made_dropped: int = 0


def _target_filter() -> dict[str, str]:
    return hostwide.syscall_filter(arch.SHM_SYSCALLS)


# Priced before it attaches (probes/hostwide.py), as fdstack: its program runs for every syscall's exit
# on the host (counted at the entry: one exit each). What a filtered run costs is fdstack's sys_exit
# program's, measured by `memdiag prepare` under the same BPF function name (the same tracepoint and
# the same early return on the syscall's number), else BENCHMARKS.md section 9's 110 ns; what
# recording one of the target's calls adds is section 9's own figure for shmwriter on the spooler,
# ~7.5 us a file made (its path read, its stack walked, its books kept; prepare does not measure it).
PRICING = hostwide.Pricing(
    probe="shmwriter",
    tracepoints=("raw_syscalls:sys_enter",),
    programs={"raw_syscalls:sys_enter": ("raw_tracepoint__sys_exit",)},
    priors_ns={"raw_tracepoint__sys_exit": 110.0},
    recorded=("raw_syscalls:sys_enter",),
    recorded_ns=7500.0,
    recorded_what="file creations, unlinks, memfd_create and shmget calls",
    event_what="syscalls (each runs its sys_exit program)",
    filters=_target_filter,
)


def requirements() -> list[kernel.Availability]:
    return [kernel.raw_syscall_tracepoints()]


def build_options() -> dict[str, int | str]:
    """The syscall numbers the program compares the raw tracepoint's calls with, and its table's room."""
    return {**arch.syscall_defines(names=arch.SHM_SYSCALLS), "MAX_MADE": MAX_MADE}


# --- what is still there -----------------------------------------------------------------------


def tmpfs_mount(path: str, mounts: Iterable[tuple[str, str]]) -> str | None:
    """The mount point a path lies on when that mount is tmpfs (mounts: (mount point, fstype) of the
    maker's mount table; the longest prefix decides), else None."""
    best, fstype = "", ""
    for point, kind in mounts:
        base = point.rstrip("/") + "/"
        if (path == point or path.startswith(base)) and len(point) > len(best):
            best, fstype = point, kind
    return best if best and fstype in SHMEM_FSTYPES else None


def file_place(path: str, mount: str) -> str:
    """A file's place as system/tmpfs.py names a pattern: the mount, the folders, the name's pattern."""
    rel = path[len(mount.rstrip("/")) :].lstrip("/")
    folder, _, name = rel.rpartition("/")
    return f"{mount.rstrip('/')}/" + fs_text((folder + "/" if folder else "") + name_pattern(name))


def match(made: Iterable[Made], there: Callable[[Made], There | None]) -> tuple[dict[tuple, list[There]], int]:
    """The things made that are still there, by stack key (there(m): where it is and its bytes, or
    None: gone, cut, or not shared memory), and how many were not."""
    out: dict[tuple, list[There]] = {}
    gone = 0
    for m in made:
        t = None if m.cut else there(m)
        if t is None:
            gone += 1
            continue
        out.setdefault(m.key, []).append(t)
    return out, gone


MOUNTINFO_BYTES = 1 << 20  # a longer mount table is not read: no view, nothing of that maker looked up
MAX_MAKERS = 65_536  # processes whose view is remembered (a pid and two numbers each)
MAX_VIEWS = 64  # makers' views of the filesystem kept (a mount namespace and root each, not a pid each)


@dataclass
class View:
    """One maker's view of the filesystem: a descriptor of its root and its mount table."""

    root: int
    mounts: list


class Views:
    """Each maker's view, taken when the probe is aimed at it (while it runs): its mount namespace,
    an O_PATH descriptor of its root, its mount table; kept by (namespace, root), not by pid, so a
    maker that exited is still looked up where it made its files, and a pid reused since is never
    read for it (its start time is kept: a process with another is not it)."""

    def __init__(self, proc: Path = Path("/proc")):
        self.proc = proc
        self.views: dict[tuple, View] = {}
        self.by_pid: dict[int, tuple[int | None, tuple]] = {}  # pid -> (its start, its view's key)

    def _start(self, pid: int) -> int | None:
        text = read_text(self.proc / str(pid) / "stat", 4096)
        rest = (text or "")[(text or "").rfind(")") + 2 :].split()
        return int(rest[19]) if len(rest) > 19 and rest[19].isdigit() else None  # field 22 of proc(5)

    def see(self, pids: Iterable[int]) -> None:
        for pid in pids:
            if pid not in self.by_pid and len(self.by_pid) < MAX_MAKERS:
                self._see(pid)

    def _see(self, pid: int) -> None:
        start = self._start(pid)
        try:
            ns = os.readlink(self.proc / str(pid) / "ns" / "mnt")
            root = open_root(self.proc / str(pid) / "root")
        except OSError:
            return
        try:
            st = stat_fd(root)  # from cache: a root on FUSE (fuse-overlayfs) is not asked
        except OSError:
            os.close(root)
            return
        key = (ns, st.dev, st.ino)
        if key in self.views or len(self.views) >= MAX_VIEWS:
            os.close(root)
            if key not in self.views:
                return
        else:
            try:
                text = read_text(self.proc / str(pid) / "mountinfo", MOUNTINFO_BYTES + 1)
            except OSError:
                text = None
            if text is None or len(text) > MOUNTINFO_BYTES:  # cut: a FUSE mount past the cut would go unseen
                os.close(root)
                return
            self.views[key] = View(root, parse_mountinfo(text))
        if start is not None and self._start(pid) == start:  # still the process whose view was read
            self.by_pid[pid] = (start, key)

    def of(self, pid: int) -> View | None:
        """The view a maker had; None for a process never seen (nor seeable now)."""
        if pid not in self.by_pid:
            self.see([pid])
        seen = self.by_pid.get(pid)
        return self.views.get(seen[1]) if seen is not None else None

    def same(self, pid: int) -> bool:
        """Whether pid is still the process seen (its /proc may be read for it: descriptors, folder);
        a process never seen (a whole-system trace aims at none) is seen now, as it is."""
        if pid not in self.by_pid:
            self.see([pid])
        seen = self.by_pid.get(pid)
        return seen is not None and seen[0] is not None and self._start(pid) == seen[0]

    def close(self) -> None:
        for v in self.views.values():
            os.close(v.root)
        self.views.clear()
        self.by_pid.clear()


class Looker:
    """What is still there, looked up once per process: its mount table, its root, its descriptors;
    the host's System V segments once. A file's path is the target's: its tmpfs mount (the longest
    mount point of the maker's table that holds it; none under or through a FUSE mount) is opened
    inside the maker's root, and the rest below that mount alone (system/safefile.open_on_mount: no
    link followed, `..` never above the mount, no other filesystem entered), the leaf on the mount's
    device. since (ns since the epoch): a file born before it, one the trace saw opened with O_CREAT
    but that was there already, is not one it made."""

    def __init__(
        self,
        same: Callable[[int], bool] | None,
        proc: Path = Path("/proc"),
        since: int | None = None,
        views: Views | None = None,
    ):
        self.same, self.proc, self.since = same, proc, since
        self.views = views if views is not None else Views(proc)
        self._own_views = views is None
        self.fds: dict[int, dict[int, str]] = {}
        self.segments: dict[int, ShmSegment] | None = None
        self.tops: dict[tuple[int, str], tuple[int, int] | None] = {}  # (pid, mount) -> (fd, st_dev)
        self.folders: dict[tuple[int, str], int | None] = {}
        self._shm_dev: int | None = None

    def _mounts(self, pid: int) -> list:
        view = self.views.of(pid)
        return view.mounts if view is not None else []

    def __call__(self, m: Made) -> There | None:
        if self.same is not None and not self.same(m.pid):
            return None
        if m.kind == "file":
            return self._file(m)
        if m.kind == "memfd":
            return self._memfd(m)
        return self._segment(m)

    def mount_of(self, pid: int, path: str) -> str | None:
        """The tmpfs mount a path of the process lies on, None: not tmpfs, or a FUSE mount at, above
        or below it (never looked through)."""
        table = self._mounts(pid)
        mount = tmpfs_mount(path, [(t.mount_point, t.fstype) for t in table])
        if mount is None or on_fuse(table, mount):
            return None
        return mount

    def _top(self, pid: int, mount: str) -> tuple[int, int] | None:
        """The mount point opened inside the process's root, with its device."""
        if (pid, mount) not in self.tops:
            got = None
            view = self.views.of(pid)
            if view is not None:
                try:
                    fd = open_dir_in(view.root, mount)
                    got = (fd, os.fstat(fd).st_dev)
                except OSError:
                    got = None
            if len(self.tops) >= OPEN_FOLDERS:
                self.close()
            self.tops[(pid, mount)] = got
        return self.tops[(pid, mount)]

    def folder(self, pid: int, mount: str, folder: str) -> tuple[int, int] | None:
        """A descriptor of a folder on the mount, below it alone, with the mount's device; kept for
        the next file in it (at most OPEN_FOLDERS kept: a spool's files share one)."""
        top = self._top(pid, mount)
        if top is None:
            return None
        rel = folder[len(mount.rstrip("/")) :].strip("/")
        if not rel:
            return top
        if (pid, folder) not in self.folders:
            try:
                fd = open_on_mount(top[0], rel, os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                fd = None
            if len(self.folders) >= OPEN_FOLDERS:
                self._close_folders()
            self.folders[(pid, folder)] = fd
        fd = self.folders[(pid, folder)]
        return None if fd is None else (fd, top[1])

    def __enter__(self) -> Looker:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()
        if self._own_views:
            self.views.close()

    def _close_folders(self) -> None:
        for fd in self.folders.values():
            if fd is not None:
                os.close(fd)
        self.folders.clear()

    def close(self) -> None:
        self._close_folders()
        for got in self.tops.values():
            if got is not None:
                os.close(got[0])
        self.tops.clear()

    def _file(self, m: Made) -> There | None:
        if not m.path.startswith("/"):  # not made absolute (resolve_relative): where it is is not known
            return None
        mount = self.mount_of(m.pid, m.path)
        if mount is None:
            return None
        folder, _, name = m.path.rpartition("/")
        where = self.folder(m.pid, mount, folder or "/")
        if where is None or not name:
            return None
        st = _stat_opened(lambda: open_on_mount(where[0], name))  # O_PATH, the leaf no link
        if st is None or st.dev != where[1] or not stat.S_ISREG(st.mode):
            return None
        if self.since is not None and (st.born_ns is None or st.born_ns < self.since):
            return None  # there before the trace began (opened with O_CREAT, not made), or no birth time to tell
        return There(where=file_place(m.path, mount), bytes=st.blocks * 512, mount=mount)

    def shm_dev(self) -> int | None:
        """The device of the kernel's internal shmem mount, where every memfd lives (one of memdiag's
        own, made and closed)."""
        if self._shm_dev is None:
            try:
                fd = os.memfd_create("memdiag-dev", os.MFD_CLOEXEC)
            except OSError:
                return None
            try:
                self._shm_dev = os.fstat(fd).st_dev
            finally:
                os.close(fd)
        return self._shm_dev

    def _memfd(self, m: Made) -> There | None:
        if not self.views.same(m.pid):
            return None  # exited (its memfds closed with it), or its pid another's now
        if m.pid not in self.fds:
            links = fd_links(m.pid, self.proc)
            self.fds[m.pid] = {int(fd): link for fd, link in (links[0] if links else [])}
        link = self.fds[m.pid].get(m.id)
        if link is None or not link.startswith(f"/memfd:{fs_text(m.path)}"):
            return None  # closed, or the number is another file's now
        # the link's text is no proof (a FUSE file may be named /memfd:...): the descriptor is opened
        # O_PATH (no open of the file) and stat'ed from cache, and must be on the memfds' own mount
        st = _stat_opened(lambda: os.open(f"{self.proc}/{m.pid}/fd/{m.id}", os.O_PATH | os.O_CLOEXEC))
        if st is None or st.dev != self.shm_dev() or not stat.S_ISREG(st.mode):
            return None
        return There(where="memfd:" + fs_text(name_pattern(m.path)), bytes=st.blocks * 512)

    def _segment(self, m: Made) -> There | None:
        if self.segments is None:
            self.segments = {g.shmid: g for g in read_sysv_shm(self.proc) or []}
        g = self.segments.get(m.id)
        if g is None or g.cpid != m.pid:
            return None  # removed, or its id is another's segment now
        key = "IPC_PRIVATE" if g.key == 0 else f"key {g.key:#x}"
        return There(where=f"System V {key}", bytes=g.rss if g.rss is not None else g.size)

    def files_there(self, pid: int, place: str) -> int | None:
        """How many regular files of a place's pattern are in its folder at the end (bounded:
        MAX_ENTRIES names listed), on its mount alone; None when the folder cannot be read."""
        folder, _, pattern = place.rpartition("/")
        mount = self.mount_of(pid, folder + "/")
        where = self.folder(pid, mount, folder or "/") if mount is not None else None
        if where is None:
            return None
        n = 0
        try:
            with os.scandir(where[0]) as entries:  # a duplicate of the folder's descriptor
                for i, e in enumerate(entries):
                    if i >= MAX_ENTRIES:
                        break
                    if e.is_file(follow_symlinks=False) and fs_text(name_pattern(e.name)) == pattern:
                        n += 1
        except OSError:
            return None
        return n


def realtime_coarse() -> int:
    """The wall clock as the kernel stamps a file's birth (the coarse clock, a tick behind the fine
    one: a file born after this reads as born after it)."""
    return time.clock_gettime_ns(getattr(time, "CLOCK_REALTIME_COARSE", 5))


def resolve_relative(m: Made, proc: Path = Path("/proc"), same: Callable[[int], bool] | None = None) -> Made:
    """A file named relative to a folder (its working directory, or openat's directory descriptor)
    made absolute by that folder as the process names it at the end (readlink, never followed): an
    estimate, as the process may have changed folder since."""
    if m.kind != "file" or m.path.startswith("/") or m.cut or (same is not None and not same(m.pid)):
        return m  # absolute already, or its maker gone (or its pid another's): its folders are not known
    link = "cwd" if m.id == AT_FDCWD else f"fd/{m.id}"
    try:
        base = os.readlink(proc / str(m.pid) / link)
    except OSError:
        return m
    if not base.startswith("/") or base.endswith(" (deleted)"):
        return m
    return m.model_copy(update={"path": base.rstrip("/") + "/" + m.path})


# --- the run -------------------------------------------------------------------------------------


def _key(k) -> tuple:
    return (k.tgid, k.stack_id, k.ip, k.at_sp, k.kind)


def made_of(bpf) -> list[Made]:
    """The program's table of things made and not unlinked."""
    out = []
    for mid, v in bpf["made"].items():
        kind = KINDS[mid.kind] if mid.kind < len(KINDS) else "file"
        raw = bytes(bytearray(mid.path)).split(b"\0", 1)[0]
        out.append(
            Made(kind=kind, pid=mid.tgid, key=_key(v.key), path=os.fsdecode(raw),
                 id=v.dirfd if kind == "file" else mid.id, ipc_key=v.ipc_key, size=v.size,
                 cut=v.path_len >= PATH_BYTES)
        )  # fmt: skip
    return out


def _comm(pid: int) -> str:
    return fs_text((read_text(Path(f"/proc/{pid}/comm"), 64) or "").strip())


@dataclass
class Books:
    created: int = 0
    removed: int = 0


def places_of(stacks: list[WriterStack], by_key: dict[tuple, list[There]], pattern: str | None) -> list[Place]:
    """Where the things still there are, most first, each with the stack that made most of them;
    the pattern asked about first whatever its size."""
    groups: dict[str, dict] = {}
    for s in stacks:
        for k in s.keys:
            for t in by_key.get(k, []):
                g = groups.setdefault(t.where, {"kind": s.kind, "mount": t.mount, "n": 0, "b": 0, "by": {}})
                g["n"] += 1
                g["b"] += t.bytes
                g["by"][id(s)] = (g["by"].get(id(s), (0, s))[0] + 1, s)
    out = []
    for where, g in groups.items():
        n, top = max(g["by"].values(), key=lambda x: x[0])
        out.append(
            Place(where=where, kind=g["kind"], mount=g["mount"], remaining=g["n"], bytes=g["b"], pid=top.pid,
                  comm=top.comm, frames=top.frames, stack_remaining=n)
        )  # fmt: skip
    out.sort(key=lambda p: (p.where == pattern, p.remaining, p.bytes), reverse=True)
    return out[:TOP_PLACES]


def writer_stack(s: StackGrowth, kind: str, comm: str, books: dict, by_key: dict[tuple, list[There]]) -> WriterStack:
    """One merged stack with its keys' books summed and what it made still there."""
    b = [books.get(k, Books()) for k in s.keys]
    held = [t for k in s.keys for t in by_key.get(k, [])]
    wheres: dict[str, int] = {}
    for t in held:
        wheres[t.where] = wheres.get(t.where, 0) + 1
    return WriterStack(
        **(s.model_dump() | {"keys": s.keys}),
        kind=kind,
        comm=comm,
        created=sum(x.created for x in b),
        removed=sum(x.removed for x in b),
        remaining=len(held),
        where=max(wheres, key=lambda w: wheres[w]) if wheres else "",
    )


def run(target, duration: float, pattern: str | None = None, top: int = 50) -> WriterResult:
    ev = EventStacks()
    since: list[int] = []  # the wall clock (ns) once the program ran: a file born before is not one it made

    views = Views()

    def attached(_bpf, pids) -> None:
        if not since:
            since.append(realtime_coarse())
        views.see(pids)  # each maker's view of the filesystem while it runs

    def collect(bpf, _elapsed: float) -> dict:
        stats = bpfstats.read(bpf, bpfstats.SHMW)
        books = {_key(k): Books(v.created, v.removed) for k, v in bpf["counts"].items()}
        made = [resolve_relative(m, same=views.same) for m in made_of(bpf)]
        look = Looker(ev.spaces.same, since=since[0] if since else None, views=views)
        with look:  # closed after each use, opened again for files_there
            by_key, gone = match(made, look)
        raw: list[RawStack] = []
        for key, r in ev.raw(bpf, lambda v: v.created, lambda _v: 0):
            held = by_key.get(_key(key), [])
            raw.append(r.model_copy(update={"key": _key(key), "count": len(held), "bytes": sum(t.bytes for t in held)}))
        by_kind: dict[int, list[RawStack]] = {}
        for r in raw:
            by_kind.setdefault(r.key[4], []).append(r)
        stacks: list[WriterStack] = []
        failed = 0
        comms: dict[int, str] = {}
        for kind, rs in by_kind.items():
            merged, f = ev.merge(rs)
            failed += f
            for s in merged:
                comm = comms.setdefault(s.pid, _comm(s.pid))
                stacks.append(writer_stack(s, KINDS[kind] if kind < len(KINDS) else "file", comm, books, by_key))
        stacks.sort(key=lambda s: (s.remaining, s.bytes, s.created), reverse=True)
        places = places_of(stacks, by_key, pattern)
        with look:
            places = [
                p.model_copy(update={"there": look.files_there(p.pid, p.where)}) if p.kind == "file" and p.pid else p
                for p in places
            ]
        fields = ev.fields(stats, stacks, failed, top, weight="remaining")
        fields["lost"] = {**fields["lost"], "made_dropped": stats["made_dropped"]}
        return {
            "events": stats["created"] + stats["removed"],
            "places": places,
            "pattern": pattern,
            "created": stats["created"],
            "removed": stats["removed"],
            "remaining": sum(s.remaining for s in stacks),
            "remaining_bytes": sum(s.bytes for s in stacks),
            "unmatched": gone,
            "cut": sum(1 for m in made if m.cut),
            "made_dropped": stats["made_dropped"],
            **fields,
        }

    spec = Run("shmwriter", WriterResult, requirements(), build_options(), collect, METHOD, spaces=ev.spaces,
               attach=attached)  # fmt: skip
    try:
        return run_probe(spec, target, duration)  # type: ignore[return-value]
    finally:
        views.close()


# --- the face --------------------------------------------------------------------------------------


def asked(r: WriterResult) -> Place | None:
    """The place the facts speak for: the pattern the diagnosis asked about (None: nothing of it was
    made while traced), else the one with the most things still there."""
    if r.pattern is not None:
        return next((p for p in r.places if p.where == r.pattern), None)
    return r.places[0] if r.places else None


def _place_line(p: Place) -> str:
    of = f" of the {fmt_number(p.there)} there at the end" if p.there is not None else ""
    return (
        f"{p.where}: {fmt_number(p.remaining)}{of} made while traced and still there ({fmt_bytes(p.bytes)}); "
        f"PID {p.pid} ({p.comm}) made {fmt_number(p.stack_remaining)} of them at one stack"
    )


def _unlinked(s: WriterStack) -> str:
    """A file stack's unlinks traced; memfds are closed and segments removed by calls not traced."""
    return f", {s.removed:,} unlinked while traced" if s.kind == "file" else ""


def describe(r: WriterResult, top: int) -> list[str]:
    lines = [
        f"  made: {r.created:,}, unlinked while traced: {r.removed:,}, still there at the end: {r.remaining:,} "
        f"({fmt_bytes(r.remaining_bytes)})"
    ]
    lines += [f"    {_place_line(p)}" for p in r.places]
    for s in r.stacks[:top]:
        lines.append(
            f"  {s.remaining:,} {NOUNS.get(s.kind, s.kind)} still there (of {s.created:,} made{_unlinked(s)}) "
            f"PID {s.pid} ({s.comm}) via {s.method}:"
        )
        lines += stack_lines(s.frames)
    return lines


def caveats(r: WriterResult) -> list[str]:
    out = [NOT_TRACED + "."]
    if r.unmatched:
        out.append(
            f"{fmt_number(r.unmatched)} things made and not unlinked while traced were gone at the end, "
            "not on a tmpfs mount, or there before the trace began (opened with O_CREAT, not made: its birth "
            "time) (unlinked by another process or by a call not traced, a memfd closed, a segment removed): "
            "not counted as still there."
        )
    if r.cut:
        out.append(f"{fmt_number(r.cut)} paths were longer than the {PATH_BYTES - 1} bytes it keeps: not matched.")
    if r.made_dropped:
        out.append(
            f"{fmt_number(r.made_dropped)} creations came once its table was full ({MAX_MADE:,}): counted as "
            "made, never as still there."
        )
    return out


def facts_of(r: WriterResult | None, plan, name) -> dict:
    priced = dict(plan.facts) if isinstance(plan, hostwide.HostWidePlan) else {}
    if r is None or r.status not in ("ok", "partial"):
        return priced
    p = asked(r)
    f: dict = priced | {
        "shmwriter.created": r.created,
        "shmwriter.remaining": r.remaining,
        "shmwriter.remaining_bytes": r.remaining_bytes,
        "shmwriter.top_remaining": p.remaining if p is not None else 0,
    }
    for kind in ("memfd", "sysv"):  # the stack leaving most of each kind, whatever the place asked about
        s = next((s for s in r.stacks if s.kind == kind and s.remaining > 0), None)
        f[f"shmwriter.{kind}_remaining"] = sum(x.remaining for x in r.stacks if x.kind == kind)
        if s is not None:
            f[f"shmwriter.{kind}_function"] = name(s.frames, [])
            f[f"shmwriter.{kind}_stack_remaining"] = s.remaining
            f[f"shmwriter.{kind}_stack_bytes"] = s.bytes
            f[f"shmwriter.{kind}_process"] = f"PID {s.pid} ({s.comm})"
    if p is not None:
        f.update(
            {
                "shmwriter.top_where": p.where,
                "shmwriter.top_kind": p.kind,
                "shmwriter.top_bytes": p.bytes,
                "shmwriter.top_there": p.there,
                "shmwriter.top_process": f"PID {p.pid} ({p.comm})" if p.pid is not None else None,
                "shmwriter.top_function": name(p.frames, []) if p.frames else None,
                "shmwriter.top_stack_remaining": p.stack_remaining,
            }
        )
    return f


def stacks(r: WriterResult) -> list[Stack]:
    """The stacks whose things are still there, most first."""
    return [
        Stack(
            frames=s.frames,
            functions=s.functions,
            bytes=s.bytes,
            count=s.remaining,
            pid=s.pid,
            detail=f"{fmt_number(s.remaining)} {NOUNS.get(s.kind, s.kind)} it made still there ({fmt_bytes(s.bytes)}), "
            f"of {fmt_number(s.created)} made{_unlinked(s)}",
        )
        for s in r.stacks
        if s.remaining > 0
    ]


def sections(r: WriterResult) -> list[Section]:
    """Where what it saw made is still there, each place with the process that made most of it."""
    if not r.places:
        return []
    rows = [
        [p.where, p.kind, fmt_number(p.remaining), "" if p.there is None else fmt_number(p.there), fmt_bytes(p.bytes),
         f"PID {p.pid} ({p.comm})", fmt_number(p.stack_remaining)]
        for p in r.places
    ]  # fmt: skip
    return [
        Section(
            probe="shmwriter",
            title="Shared memory made and still there",
            lines=[f"Made while traced ({r.duration_s:.0f} s) and still there at its end, by place."],
            header=[
                "place",
                "kind",
                "made, still there",
                "there at the end",
                "bytes",
                "maker",
                "of them at its top stack",
            ],
            rows=rows,
        )
    ]


def _run(target, ctx) -> WriterResult:
    seconds = hostwide.run_seconds(ctx)  # shortened where its plan said the budget pays for less
    return run(target, seconds, pattern=ctx.options.get("pattern"), top=ctx.options.get("top", 50))


FACE = Face(
    name="shmwriter",
    summary="tmpfs files, memfds and System V segments still there, by the process and stack that made them",
    run=_run,
    result=WriterResult,
    describe=describe,
    caveats=caveats,
    sections=sections,
    plan=lambda target, ctx: hostwide.plan(PRICING, target, ctx),
    planning=f"counting the host's syscalls on every CPU for {hostwide.COUNT_S:g} s",
    options=(Option("--pattern", "pattern", "the place to name the maker of: a tmpfs pattern (/dev/shm/job-*.spool)"),),
    facts=(
        FactDef("shmwriter.created", "number", "tmpfs files, memfds and System V segments made during the probe"),
        FactDef("shmwriter.remaining", "number", "of those, how many were still there at its end"),
        FactDef("shmwriter.remaining_bytes", "bytes", "the memory those still there hold"),
        FactDef("shmwriter.top_where", "string", "where they are: the tmpfs pattern asked about, a memfd name, a key"),
        FactDef("shmwriter.top_kind", "string", "what is there: file, memfd or sysv"),
        FactDef("shmwriter.top_remaining", "number", "how many made during the probe are still there"),
        FactDef("shmwriter.top_bytes", "bytes", "the memory they hold"),
        FactDef("shmwriter.top_there", "number", "files of that pattern on the mount at the end, made then or before"),
        FactDef("shmwriter.top_process", "string", "the process whose stack made most of them: PID 812 (spooler)"),
        FactDef("shmwriter.top_function", "string", "the function of the stack that made most of them"),
        FactDef("shmwriter.top_stack_remaining", "number", "how many of them that stack made"),
        *PRICING.facts(),
        FactDef("shmwriter.memfd_remaining", "number", "memfds made during the probe and still there at its end"),
        FactDef("shmwriter.memfd_function", "string", "the function of the stack that left most of them"),
        FactDef("shmwriter.memfd_stack_remaining", "number", "how many that stack left"),
        FactDef("shmwriter.memfd_stack_bytes", "bytes", "the memory they hold"),
        FactDef("shmwriter.memfd_process", "string", "the process of that stack: PID 812 (render)"),
        FactDef(
            "shmwriter.sysv_remaining", "number", "System V segments made during the probe and still there at its end"
        ),
        FactDef("shmwriter.sysv_function", "string", "the function of the stack that left most of them"),
        FactDef("shmwriter.sysv_stack_remaining", "number", "how many that stack left"),
        FactDef("shmwriter.sysv_stack_bytes", "bytes", "the memory they hold"),
        FactDef("shmwriter.sysv_process", "string", "the process of that stack: PID 812 (render)"),
    ),
    facts_of=facts_of,
    # what is held at the end, as kmemstack's outstanding objects: bytes and things still there
    stacks=Stacks(
        kind="allocations",
        shown=3,
        of=stacks,
        folded=lambda r: r.folded,
        space="inuse_space",
        counted="inuse_objects",
        folded_by="count",
    ),  # fmt: skip
)


def _stat_opened(opener):
    """stat_fd of what opener() opens (an O_PATH descriptor), closed again; None where either fails."""
    try:
        fd = opener()
    except OSError:
        return None
    try:
        return stat_fd(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
