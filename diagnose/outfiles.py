"""Files memdiag (as root) writes where a user said, made so that no other user can redirect them.

A report folder is used only if no one but root and memdiag's own user can add entries to it: an
existing folder owned by someone else, or group/world-writable, is refused; a new one is created
mode 700 (reports hold command lines, paths and symbols of the target, which may be private).
Every file is written through a descriptor of its folder (opened with O_NOFOLLOW) under a temporary
name created with O_EXCL|O_NOFOLLOW, then renamed over the final name: a symlink planted at either
name is removed or replaced, never followed. The folder's own path is the user's to choose, but its
last component may not be a symlink (the predictable default name must not lead elsewhere), and it
may not be on a filesystem of kernel objects (in cgroupfs, mkdir makes a cgroup).

Who may plant links is decided here once (unsafe_folder, unsafe_ancestors), for the CLI's report
folders and for `memdiag serve --data`, which checks every folder above its own as well."""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

from memdiag.system.cgroup import parse_mountinfo

from .errors import UsageError

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
FOLDER_MODE = 0o700
FILE_MODE = 0o600
# filesystems of kernel objects, not storage: a mkdir there makes a cgroup, a configfs item or a
# tracing instance (and proc, sysfs and the rest refuse it, or make something that is not a folder)
KERNEL_FILESYSTEMS = frozenset(
    {"cgroup", "cgroup2", "proc", "sysfs", "configfs", "tracefs", "debugfs", "securityfs", "bpf", "pstore", "efivarfs"}
)


class ReportFolder:
    """An open report folder, checked: write its files through it, then close it."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def write(self, files: Mapping[str, str | bytes]) -> None:
        """Each file replaced whole (a reader never sees half a file). OSError as the system says."""
        for name, text in files.items():
            _replace(self.fd, name, text)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> ReportFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_report_folder(path: Path, label: str) -> ReportFolder:
    """The folder at path (created mode 700 if missing), proved writable; UsageError (label names it:
    "--output DIR" or "report folder DIR") when it cannot be written or another user could write to it."""
    created = False
    if kind := kernel_filesystem(path):
        raise UsageError(f"{label}: {on_kernel_filesystem(kind)}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, FOLDER_MODE)
        created = True
    except FileExistsError:
        pass
    except OSError as e:
        raise UsageError(f"{label}: cannot write there ({e.strerror or e})") from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except OSError as e:
        raise UsageError(f"{label}: {_open_problem(path, e)}") from None
    try:
        st = os.fstat(fd)
        if created and st.st_uid == os.geteuid():
            os.fchmod(fd, FOLDER_MODE)  # whatever the umask took away or left
            st = os.fstat(fd)
        if problem := unsafe_folder(st, path):
            raise UsageError(f"{label}: {problem}")
        _prove_writable(fd)
    except OSError as e:
        os.close(fd)
        raise UsageError(f"{label}: cannot write there ({e.strerror or e})") from None
    except UsageError:
        os.close(fd)
        raise
    return ReportFolder(path, fd)


def write_file(path: Path, text: str) -> None:
    """One file at a path the user named, replaced whole; a symlink at that name is replaced, not
    followed. OSError as the system says."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _replace(dfd, path.name, text)
    finally:
        os.close(dfd)


def _replace(dfd: int, name: str, text: str | bytes) -> None:
    tmp = f".{name}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dfd)  # a leftover, or a planted link: the link goes, its target stays
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE, dir_fd=dfd)
    try:
        if isinstance(text, bytes):  # a gzipped profile
            with os.fdopen(fd, "wb") as f:
                f.write(text)
        else:
            with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
                f.write(text)
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise


def unsafe_folder(st: os.stat_result, path: Path, noun: str = "report folder") -> str | None:
    """Why another user could plant links in this folder (its fstat), or None."""
    if st.st_uid not in (0, os.geteuid()):
        return (
            f"refusing a {noun} owned by {_user(st.st_uid)}: its owner could plant links that memdiag "
            f"would write through; name a new folder (memdiag creates it, mode 700) or one owned by root"
        )
    if st.st_mode & 0o022:
        return (
            f"refusing a {noun} others can write to (mode {st.st_mode & 0o7777:o}): they could plant "
            f"links that memdiag would write through; run chmod go-w {path} or name a new folder"
        )
    return None


def unsafe_ancestors(path: Path) -> str | None:
    """Why another user could swap one of the folders above `path` (an absolute path, links resolved)
    for a link, or None: each existing one must be root's or this user's, and not writable by its
    group or others unless sticky (as /tmp: there only an entry's owner may rename or remove it, and
    the entry below is checked in turn)."""
    for folder in path.parents:
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            continue  # made by memdiag, mode 700
        if st.st_uid not in (0, os.geteuid()):
            return (
                f"{folder} above it is owned by {_user(st.st_uid)}, who could swap the folders below it for "
                "links memdiag would write through; use a folder whose parents are root's"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            return (
                f"{folder} above it can be written by others (mode {st.st_mode & 0o7777:o}): they could swap "
                f"the folders below it for links memdiag would write through; run chmod go-w {folder}"
            )
    return None


def kernel_filesystem(path: Path) -> str | None:
    """The filesystem of kernel objects (KERNEL_FILESYSTEMS) that `path`, or its nearest existing
    folder, is on; None for storage."""
    real = Path(os.path.realpath(path))
    try:
        mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:  # no /proc: nothing known, and the mkdir says what it says
        return None
    above = [m for m in mounts if real == Path(m.mount_point) or Path(m.mount_point) in real.parents]
    if not above:
        return None
    # the longest mount point; of two at the same point the later, mounted over the other, is seen
    fstype = max(enumerate(above), key=lambda im: (len(im[1].mount_point), im[0]))[1].fstype
    return fstype if fstype in KERNEL_FILESYSTEMS else None


def on_kernel_filesystem(fstype: str) -> str:
    return (
        f"on the {fstype} filesystem, which holds kernel objects, not files (in cgroupfs a new folder is a new "
        "cgroup): name a folder on a disk"
    )


def _open_problem(path: Path, e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):  # (O_DIRECTORY: ENOTDIR for a link)
        return f"is a symbolic link; name the folder itself ({os.path.realpath(path)})"
    if e.errno == errno.ENOTDIR:
        return "not a folder"
    return f"cannot write there ({e.strerror or e})"


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _prove_writable(dfd: int) -> None:
    """Before the window, not after it: create and remove a file in the folder."""
    name = f".memdiag-{os.getpid()}.probe"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dfd)
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, FILE_MODE, dir_fd=dfd))
    os.unlink(name, dir_fd=dfd)
