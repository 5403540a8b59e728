"""Reading files a target controls: inside the target's own root, never through a link that leaves
it, never a FIFO or a device, never more than a stated number of bytes.

memdiag runs as root and reads files the target writes or chooses (its JIT's perf map, its JDK's
`release`, its hsperfdata, its flight recording). A path under /proc/PID/root is resolved by the
kernel against *memdiag's* root as soon as it meets an absolute symlink, so a container's
`/tmp/perf-1.map -> /etc/shadow` would hand memdiag the host's file. Here every such path is opened
with openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) from a descriptor of the target's root: its
symlinks resolve inside that root, `..` stops at it, and /proc's magic links are refused. The open
is non-blocking (a FIFO planted where a file is expected would block open(2) forever), the result
must be a regular file (fstat), and where `owner` is given the file must belong to that uid (a
host process's /tmp is shared: another user may plant a file under the name the target would
use). Where the kernel has no openat2 (before 5.6), the path is walked one component at a time
with O_NOFOLLOW: no symlink at all is followed, which is stricter and refuses more."""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from pathlib import Path

from .arch import syscall_number

# None on a machine memdiag knows no numbers for: the component walk stands in (stricter)
_SYS_OPENAT2 = syscall_number("openat2")
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10
# below a directory, never through a link of any kind, never onto another mount
RESOLVE_STAY = RESOLVE_BENEATH | RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_libc = None
_have_openat2: bool | None = None


class Unsafe(OSError):
    """A target file refused: not a regular file, not the expected owner, or past the bound."""


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def _openat2(dirfd: int, path: str, flags: int, resolve: int = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS) -> int:
    if _SYS_OPENAT2 is None:
        raise OSError(errno.ENOSYS, "openat2's number is not known on this machine", path)
    how = _OpenHow(flags, 0, resolve)
    fd = _syscall()(
        ctypes.c_long(_SYS_OPENAT2),
        ctypes.c_int(dirfd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _walk(dirfd: int, path: str, flags: int) -> int:
    """openat2's fallback: each component opened with O_NOFOLLOW from the one before; '..' refused."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise OSError(errno.EPERM, "path leaves the root", path)
    fd = os.dup(dirfd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def open_root(root: str | Path) -> int:
    """A descriptor of a root directory (a target's /proc/PID/root, or '/'), to open paths inside it."""
    return os.open(str(root), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def _resolve(root_fd: int, path: str, flags: int) -> int:
    """`path` opened with `flags`, resolved inside the root `root_fd` (openat2, else the walk)."""
    global _have_openat2
    rel = path.lstrip("/") or "."
    fd = -1
    if _have_openat2 is not False:
        try:
            fd = _openat2(root_fd, rel, flags)
            _have_openat2 = True
        except OSError as e:
            if e.errno not in (errno.ENOSYS, errno.EPERM) or _have_openat2:
                raise
            _have_openat2 = False  # no openat2 here (or a seccomp filter refuses it): walk instead
    if fd < 0:
        fd = _walk(root_fd, rel, flags)
    return fd


def open_dir_in(root_fd: int, path: str) -> int:
    """A descriptor of a directory inside the root `root_fd` (the target's /tmp), to list it and to
    create, open and remove files in it by name (dir_fd=): what is done there stays inside it."""
    return _resolve(root_fd, path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_on_mount(dir_fd: int, path: str, flags: int = os.O_PATH) -> int:
    """`path` opened below the directory `dir_fd` and on its mount alone (openat2 RESOLVE_BENEATH |
    RESOLVE_NO_XDEV | RESOLVE_NO_SYMLINKS): no link followed, `..` never above dir_fd, no other
    filesystem entered, so none is asked anything (a FUSE daemon the target runs could leave a lookup
    unanswered for ever). No fallback: without openat2 (before 5.6) it raises ENOSYS."""
    return _openat2(dir_fd, path.lstrip("/") or ".", flags | os.O_CLOEXEC | os.O_NOFOLLOW, RESOLVE_STAY)


class _Timestamp(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_uint32), ("_pad", ctypes.c_int32)]


class _Statx(ctypes.Structure):
    _fields_ = [
        ("stx_mask", ctypes.c_uint32), ("stx_blksize", ctypes.c_uint32), ("stx_attributes", ctypes.c_uint64),
        ("stx_nlink", ctypes.c_uint32), ("stx_uid", ctypes.c_uint32), ("stx_gid", ctypes.c_uint32),
        ("stx_mode", ctypes.c_uint16), ("_pad1", ctypes.c_uint16), ("stx_ino", ctypes.c_uint64),
        ("stx_size", ctypes.c_uint64), ("stx_blocks", ctypes.c_uint64), ("stx_attributes_mask", ctypes.c_uint64),
        ("stx_atime", _Timestamp), ("stx_btime", _Timestamp), ("stx_ctime", _Timestamp),
        ("stx_mtime", _Timestamp), ("stx_rdev_major", ctypes.c_uint32), ("stx_rdev_minor", ctypes.c_uint32),
        ("stx_dev_major", ctypes.c_uint32), ("stx_dev_minor", ctypes.c_uint32), ("_spare", ctypes.c_uint64 * 14),
    ]  # fmt: skip


_AT_EMPTY_PATH = 0x1000
_AT_STATX_DONT_SYNC = 0x4000
_STATX_BASIC_STATS = 0x7FF
_STATX_BTIME = 0x800


class Stat(tuple):
    """What statx says of an open file: (dev, ino, mode, blocks, birth time in ns since the epoch or
    None where the filesystem keeps none)."""

    dev = property(lambda s: s[0])
    ino = property(lambda s: s[1])
    mode = property(lambda s: s[2])
    blocks = property(lambda s: s[3])
    born_ns = property(lambda s: s[4])


def stat_fd(fd: int) -> Stat:
    """statx of an open descriptor (an O_PATH one too) with AT_STATX_DONT_SYNC: a network or FUSE
    filesystem answers from its cache, its server or daemon never asked."""
    buf = _Statx()
    _syscall()  # loads libc once
    r = _libc.statx(fd, b"", _AT_EMPTY_PATH | _AT_STATX_DONT_SYNC, _STATX_BASIC_STATS | _STATX_BTIME, ctypes.byref(buf))
    if r != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    born = buf.stx_btime.tv_sec * 1_000_000_000 + buf.stx_btime.tv_nsec if buf.stx_mask & _STATX_BTIME else None
    return Stat((os.makedev(buf.stx_dev_major, buf.stx_dev_minor), buf.stx_ino, buf.stx_mode, buf.stx_blocks, born))


def open_in(root_fd: int, path: str, *, follow_leaf: bool = True, owner: int | None = None) -> int:
    """A read-only, non-blocking descriptor of a regular file at `path` inside the root `root_fd`.
    follow_leaf=False refuses a symlink as the last component (a file the target names by its own
    convention, never legitimately a link). Unsafe where it is no regular file or not `owner`'s."""
    fd = _resolve(root_fd, path, _OPEN_FLAGS | (0 if follow_leaf else os.O_NOFOLLOW))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(errno.EINVAL, "not a regular file", path)
        if owner is not None and st.st_uid != owner:
            raise Unsafe(errno.EPERM, f"owned by uid {st.st_uid}, not the target's {owner}", path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | Path, expect: tuple[int, int] | None = None) -> int:
    """A read-only descriptor of the regular file at path (a host path memdiag resolved, a
    map_files name), opened without blocking: a FIFO a target swapped in under a path memdiag
    looked at a moment ago is refused, never waited on. expect: the (device, inode) looked at; the
    file opened must be that one (a file swapped in between the look and the open is refused)."""
    fd = os.open(str(path), _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unsafe(errno.EINVAL, "not a regular file", str(path))
        if expect is not None and (st.st_dev, st.st_ino) != expect:
            raise Unsafe(errno.ESTALE, "not the file looked at (replaced meanwhile)", str(path))
    except BaseException:
        os.close(fd)
        raise
    return fd


# Entries of a target's folder looked at, at most: a /tmp is the target's to fill (ten million
# files is a few GiB of names in one listdir), and what memdiag looks for there is named.
MAX_DIR_ENTRIES = 100_000


def names_in(dir_fd: int, prefix: str, limit: int = MAX_DIR_ENTRIES) -> list[str]:
    """Names starting with prefix in the directory dir_fd, among its first `limit` entries (the
    directory's own order), never the whole listing held at once."""
    found = []
    with os.scandir(dir_fd) as entries:  # scandir works on a duplicate of dir_fd
        for n, entry in enumerate(entries):
            if n >= limit:
                break
            if entry.name.startswith(prefix):
                found.append(entry.name)
    return found


def read_fd(fd: int, max_bytes: int, *, tail: bool = False) -> tuple[bytes, bool]:
    """At most max_bytes of an open file (its last max_bytes where tail): (data, truncated)."""
    size = os.fstat(fd).st_size
    truncated = size > max_bytes
    if tail and truncated:
        os.lseek(fd, size - max_bytes, os.SEEK_SET)
    chunks, left = [], max_bytes
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    if left == 0 and os.read(fd, 1):
        truncated = True  # it grew past the bound while being read (or lied about its size)
    return b"".join(chunks), truncated


def read_in_root(
    root: str | Path, path: str, max_bytes: int, *, follow_leaf: bool = True, owner: int | None = None
) -> bytes | None:
    """The first max_bytes of a regular file inside a root, resolved as the target would resolve it
    and never outside it; None where it is missing, unreadable, not a regular file or not owner's."""
    try:
        rfd = open_root(root)
    except OSError:
        return None
    try:
        fd = open_in(rfd, path, follow_leaf=follow_leaf, owner=owner)
    except OSError:
        return None
    finally:
        os.close(rfd)
    try:
        return read_fd(fd, max_bytes)[0]
    except OSError:
        return None
    finally:
        os.close(fd)


def proc_root(pid: int, proc: Path = Path("/proc")) -> Path:
    """A process's root directory as memdiag reaches it."""
    return proc / str(pid) / "root"
