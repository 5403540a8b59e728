"""A process's open descriptors by type, from the links in /proc/PID/fd (read with readlink, never
followed or opened): sockets, pipes, eventfd, epoll, inotify, memfd, timerfd, signalfd, files and
the rest. Each costs the kernel memory RSS does not show (a struct file, an inode for sockets and
pipes, socket buffers, a pipe's ring), so descriptors that only accumulate are a leak no heap holds."""

from __future__ import annotations

import os
from pathlib import Path

from ._parse import fs_text

# A process may hold a million descriptors (its RLIMIT_NOFILE is its own): a sample reads at most
# this many links and says so ("more") when it stopped short.
MAX_FDS = 65536

TYPES = ("socket", "pipe", "eventfd", "epoll", "inotify", "memfd", "timerfd", "signalfd", "file", "other")

_ANON = {
    "[eventfd]": "eventfd",
    "[eventpoll]": "epoll",
    "inotify": "inotify",
    "[timerfd]": "timerfd",
    "[signalfd]": "signalfd",
}


def fd_type(link: str) -> str:
    """The type of a descriptor from its /proc/PID/fd link text."""
    if link.startswith("socket:"):
        return "socket"
    if link.startswith("pipe:"):
        return "pipe"
    if link.startswith("anon_inode:"):
        return _ANON.get(link[len("anon_inode:") :], "other")
    if link.startswith("/memfd:"):
        return "memfd"
    if link.startswith("/"):
        return "file"
    return "other"


def fd_links(pid: int, root: Path = Path("/proc"), limit: int = MAX_FDS) -> tuple[list[tuple[str, str]], bool] | None:
    """(descriptor number, its link's text) of at most `limit` of the process's descriptors, and
    whether it holds more; None when it is gone or unreadable. The one walk of /proc/PID/fd."""
    base = f"{root}/{pid}/fd"
    out: list[tuple[str, str]] = []
    try:
        with os.scandir(base) as entries:
            for entry in entries:
                if len(out) >= limit:
                    return out, True
                try:
                    out.append((entry.name, fs_text(os.readlink(f"{base}/{entry.name}"))))
                except OSError:  # closed between the listing and the read
                    continue
    except OSError:
        return None
    return out, False


def read_fd_types(pid: int, root: Path = Path("/proc"), limit: int = MAX_FDS) -> dict[str, int] | None:
    """{type: count} of the process's descriptors, with "total" (every descriptor read) and "more"
    (1 when it holds more than `limit`, then not all were read); None when it is gone or unreadable."""
    links = fd_links(pid, root, limit)
    if links is None:
        return None
    counts: dict[str, int] = {}
    for _fd, link in links[0]:
        kind = fd_type(link)
        counts[kind] = counts.get(kind, 0) + 1
    if links[1]:
        counts["more"] = 1
    counts["total"] = len(links[0])
    return counts


def read_memfds(pid: int, root: Path = Path("/proc"), limit: int = MAX_FDS) -> list[tuple[str, int]] | None:
    """(name, bytes it holds) of each memfd the process has open, largest first: anonymous files in
    shared memory, in no tmpfs mount. stat() of the descriptor's link, never an open or a read of it."""
    links = fd_links(pid, root, limit)
    if links is None:
        return None
    out: list[tuple[str, int]] = []
    for fd, link in links[0]:
        if link.startswith("/memfd:"):
            try:  # a memfd is unlinked from birth: a link without " (deleted)" is a file named so, not stat'ed
                if not link.endswith(" (deleted)"):
                    continue
                out.append((link[1:].removesuffix(" (deleted)"), os.stat(f"{root}/{pid}/fd/{fd}").st_blocks * 512))
            except OSError:
                continue
    return sorted(out, key=lambda x: -x[1])
