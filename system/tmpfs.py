"""Shared memory held in files: the tmpfs mounts a process sees (/dev/shm, /run, a container's /tmp)
with the bytes each holds, and what fills one: its files grouped by name pattern (job-17.spool and
job-18.spool are job-*.spool), with count and bytes. No process's RSS counts a file written to tmpfs
and closed: it is the host's Shmem (and the writer's cgroup's shmem) until someone unlinks it.

The mounts are read from the target's own mount table and opened inside its root (a container's
/dev/shm is not the host's), never through a link it planted; the walk is bounded in entries and
depth, stats without following links, and never opens a file."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ._parse import Fact, fs_text, read_text
from .cgroup import on_fuse, parse_mountinfo
from .safefile import open_dir_in, open_root

SHMEM_FSTYPES = ("tmpfs",)
MAX_MOUNTS = 64  # a host with hundreds of tmpfs mounts (one a container) has its first 64 read
MAX_ENTRIES = 20000  # entries stat'ed in one mount's walk; past it the walk says "partial"
MAX_DEPTH = 8
TOP_PATTERNS = 8

_DIGITS = re.compile(r"\d+")
_HEX = re.compile(r"(?<![0-9a-zA-Z])[0-9a-f]{8,}(?![0-9a-zA-Z])")


class FilePattern(Fact):
    pattern: str  # directory/name with digit runs as *: "spool/job-*.tmp"
    files: int
    bytes: int  # blocks allocated (what the memory costs), not the apparent size


class ShmMount(Fact):
    mount_point: str
    used: int  # bytes the filesystem holds (statvfs: blocks in use)
    size: int | None = None  # its size limit (size=), None: unknown
    patterns: list[FilePattern] = []  # largest first; filled where the mount was walked
    files: int = 0
    partial: bool = False  # the walk stopped at MAX_ENTRIES or MAX_DEPTH


def name_pattern(name: str) -> str:
    """A file name with the parts that vary between files of one kind replaced by `*`."""
    return _DIGITS.sub("*", _HEX.sub("*", name))


def shm_mounts(mountinfo: str) -> list[str]:
    """The mount points of tmpfs filesystems in a mount table, in its order, at most MAX_MOUNTS."""
    points = [m.mount_point for m in parse_mountinfo(mountinfo) if m.fstype in SHMEM_FSTYPES]
    return list(dict.fromkeys(points))[:MAX_MOUNTS]


class _Walk:
    """One bounded walk of a tmpfs mount: its files by pattern. It never leaves the mount: the mount
    points below it (from the mount table) are passed over unread, and anything on another device
    too, so no other filesystem is asked anything (a FUSE mount a container put there could leave a
    stat unanswered for ever)."""

    def __init__(self, dev: int, below: set[str]):
        self.dev, self.below = dev, below
        self.groups: dict[str, list[int]] = {}
        self.budget = MAX_ENTRIES
        self.complete = True

    def walk(self, dir_fd: int, prefix: str = "", depth: int = 0) -> None:
        with os.scandir(dir_fd) as entries:
            for entry in entries:
                if self.budget <= 0:
                    self.complete = False
                    return
                self.budget -= 1
                if prefix + entry.name in self.below:  # another filesystem mounted here
                    continue
                try:
                    if entry.is_dir(follow_symlinks=False):  # the directory entry's type: no stat
                        self._into(dir_fd, entry.name, prefix, depth)
                    elif entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        if st.st_dev == self.dev:
                            g = self.groups.setdefault(fs_text(prefix + name_pattern(entry.name)), [0, 0])
                            g[0] += 1
                            g[1] += st.st_blocks * 512
                except OSError:
                    continue

    def _into(self, dir_fd: int, name: str, prefix: str, depth: int) -> None:
        if depth >= MAX_DEPTH:
            self.complete = False
            return
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        try:
            if os.fstat(sub).st_dev == self.dev:
                self.walk(sub, f"{prefix}{name}/", depth + 1)
        finally:
            os.close(sub)


def read_mount(root_fd: int, mount_point: str, walk: bool, below: set[str] | None = None) -> ShmMount | None:
    """One tmpfs mount inside the root `root_fd`: its use and, where walk, its files by pattern
    (`below`: the mount points under it, relative to it, never entered). A tmpfs without a size
    limit (size=0) says no use in statvfs: its files' blocks are its use then."""
    try:
        fd = open_dir_in(root_fd, mount_point)
    except OSError:
        return None
    try:
        vfs = os.fstatvfs(fd)
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        size = vfs.f_blocks * vfs.f_frsize or None
        if not walk:
            return ShmMount(mount_point=mount_point, used=used, size=size) if size is not None else None
        w = _Walk(os.fstat(fd).st_dev, below or set())
        w.walk(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if size is None:
        used = sum(b for _n, b in w.groups.values())
    top = sorted(w.groups.items(), key=lambda kv: -kv[1][1])[:TOP_PATTERNS]
    return ShmMount(
        mount_point=mount_point,
        used=used,
        size=size,
        patterns=[FilePattern(pattern=p, files=n, bytes=b) for p, (n, b) in top],
        files=sum(n for n, _b in w.groups.values()),
        partial=not w.complete,
    )


def _below(mount_point: str, points: list[str]) -> set[str]:
    """The mount points under `mount_point`, relative to it."""
    base = mount_point.rstrip("/") + "/"
    return {p[len(base) :].rstrip("/") for p in points if p.startswith(base)}


def read_shm_mounts(
    pid: int | None = None, proc: Path = Path("/proc"), walk: bool = False, only: str | None = None
) -> list[ShmMount] | None:
    """The tmpfs mounts the process sees (pid None: memdiag's own view, the host's), by use, largest
    first; None when its mount table cannot be read. only: that mount point alone."""
    who = "self" if pid is None else str(pid)
    try:  # a process exiting has a mount table that cannot be read any more (EINVAL)
        text = read_text(proc / who / "mountinfo", 1 << 20)
    except OSError:
        return None
    if text is None:
        return None
    try:
        root_fd = open_root(proc / who / "root")
    except OSError:
        return None
    table = parse_mountinfo(text)
    points = [m.mount_point for m in table]
    try:
        mounts = [
            m
            for p in shm_mounts(text)
            if only is None or p == only
            # a path through a FUSE mount is never looked up: its daemon is the target's to answer
            if not on_fuse(table, p) and (m := read_mount(root_fd, p, walk, _below(p, points))) is not None
        ]
    finally:
        os.close(root_fd)
    return sorted(mounts, key=lambda m: -m.used)
