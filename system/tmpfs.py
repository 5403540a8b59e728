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
import stat
from pathlib import Path

from ._parse import Fact, read_text
from .cgroup import parse_mountinfo
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


def _walk(dir_fd: int, prefix: str, depth: int, groups: dict[str, list[int]], budget: list[int]) -> bool:
    """Group the files under dir_fd by pattern; False when the walk was cut short."""
    complete = True
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            if budget[0] <= 0:
                return False
            budget[0] -= 1
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if depth >= MAX_DEPTH:
                    complete = False
                    continue
                try:
                    sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                except OSError:
                    continue
                try:
                    complete = _walk(sub, f"{prefix}{entry.name}/", depth + 1, groups, budget) and complete
                finally:
                    os.close(sub)
            elif stat.S_ISREG(st.st_mode):
                g = groups.setdefault(prefix + name_pattern(entry.name), [0, 0])
                g[0] += 1
                g[1] += st.st_blocks * 512
    return complete


def read_mount(root_fd: int, mount_point: str, walk: bool) -> ShmMount | None:
    """One tmpfs mount inside the root `root_fd`: its use and, where walk, its files by pattern."""
    try:
        fd = open_dir_in(root_fd, mount_point)
    except OSError:
        return None
    try:
        vfs = os.fstatvfs(fd)
        used = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        size = vfs.f_blocks * vfs.f_frsize or None
        if not walk:
            return ShmMount(mount_point=mount_point, used=used, size=size)
        groups: dict[str, list[int]] = {}
        complete = _walk(fd, "", 0, groups, [MAX_ENTRIES])
    except OSError:
        return None
    finally:
        os.close(fd)
    top = sorted(groups.items(), key=lambda kv: -kv[1][1])[:TOP_PATTERNS]
    return ShmMount(
        mount_point=mount_point,
        used=used,
        size=size,
        patterns=[FilePattern(pattern=p, files=n, bytes=b) for p, (n, b) in top],
        files=sum(n for n, _b in groups.values()),
        partial=not complete,
    )


def read_shm_mounts(pid: int | None = None, proc: Path = Path("/proc"), walk: bool = False) -> list[ShmMount] | None:
    """The tmpfs mounts the process sees (pid None: memdiag's own view, the host's), by use, largest
    first; None when its mount table cannot be read."""
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
    try:
        mounts = [m for p in shm_mounts(text) if (m := read_mount(root_fd, p, walk)) is not None]
    finally:
        os.close(root_fd)
    return sorted(mounts, key=lambda m: -m.used)
