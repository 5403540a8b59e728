"""Where policy may come from, and how a rule file's bytes are read.

memdiag runs as root and a rule file decides verdicts, so policy is read only from trusted places:
the shipped playbook, the site folder (/etc/memdiag/playbooks, or $MEMDIAG_PLAYBOOK_DIR) and
--playbook paths, each owned by root (or the user memdiag runs as) and not writable by group or
others, up every folder to /. Nothing is read from the working folder unless named.

Every rule file, trusted or only linted, is read the same bounded way: a regular file (a FIFO,
a device or a folder is refused before it is opened), opened without following a symlink and
without blocking, at most MAX_BYTES read. A regular file on a kernel filesystem (procfs, sysfs,
tracefs, debugfs, cgroupfs...) is an interface, not a file of rules: reading /proc/kmsg or a
trace_pipe takes data from its other readers, so such files are refused before a byte is read."""

from __future__ import annotations

import ctypes
import os
import platform
import stat
from importlib.resources import files
from pathlib import Path

MAX_BYTES = 1 << 20  # a playbook is a few KiB; a 1 MiB cap still parses in well under a second
SITE_DIR = Path("/etc/memdiag/playbooks")
SITE_DIR_ENV = "MEMDIAG_PLAYBOOK_DIR"
MAX_ERRORS = 50  # shown of a rule file's errors: the first ones say what is wrong, the rest is noise
MAX_ERROR_CHARS = 1000  # of one error line: a 64 KiB id is not repeated in every message

# Kernel filesystems whose regular files are interfaces (linux/magic.h): reading one can consume
# data (trace_pipe, /proc/kmsg) or block, and none holds an admin's rule file.
_KERNEL_FS = {
    0x9FA0: "procfs",
    0x62656572: "sysfs",
    0x74726163: "tracefs",
    0x64626720: "debugfs",
    0x27E0EB: "cgroupfs",
    0x63677270: "cgroup2fs",
    0x62656570: "configfs",
    0x73636673: "securityfs",
    0xCAFE4A11: "bpffs",
    0x6165676C: "pstorefs",
    0xDE5E81E4: "efivarfs",
    0xF97CFF8C: "selinuxfs",
    0x43415D53: "smackfs",
    0x42494E4D: "binfmt_misc",
    0x65735543: "fusectl",
    0x1CD1: "devpts",
    0x19800202: "mqueue",
    0x67596969: "rpc_pipefs",
    0x6E736673: "nsfs",
    0xABBA1974: "xenfs",
}

_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFSOCK: "a socket",
    stat.S_IFLNK: "a symbolic link",
}


class RuleFileError(Exception):
    """One or more errors in rule files, each as 'file:line: message' (or 'file: message')."""

    def __init__(self, errors: list[str], more: int = 0):
        """Keeps the first MAX_ERRORS errors, each cut to MAX_ERROR_CHARS; more: how many other
        errors were found and only counted."""
        kept = [e if len(e) <= MAX_ERROR_CHARS else e[: MAX_ERROR_CHARS - 1] + "…" for e in errors[:MAX_ERRORS]]
        super().__init__("\n".join(kept))
        self.errors = kept
        self.more = more + max(0, len(errors) - MAX_ERRORS)

    def usage_text(self) -> str:
        """One line for one error; a list for several, at most MAX_ERRORS of them."""
        if len(self.errors) == 1 and not self.more:
            return f"bad rule file: {self.errors[0]}"
        tail = [f"  ... and {self.more} more"] if self.more else []
        return "bad rule files:\n" + "\n".join([*(f"  {line}" for line in self.errors), *tail])


class Errors:
    """Errors as they are found, the first MAX_ERRORS kept and the rest only counted: a file of
    400,000 bad rules costs a count, not 400,000 formatted lines."""

    def __init__(self) -> None:
        self.kept: list[str] = []
        self.more = 0

    @property
    def full(self) -> bool:
        return len(self.kept) >= MAX_ERRORS

    def add(self, errors: list[str], more: int = 0) -> None:
        room = MAX_ERRORS - len(self.kept)
        self.kept += errors[:room]
        self.more += more + max(0, len(errors) - room)

    def count(self, n: int) -> None:
        self.more += n

    def raise_any(self) -> None:
        if self.kept or self.more:
            raise RuleFileError(self.kept, self.more)


def shipped_dir() -> Path:
    return Path(str(files("memdiag.playbooks")))


def site_dir() -> Path:
    """The site's playbook folder: $MEMDIAG_PLAYBOOK_DIR, else /etc/memdiag/playbooks."""
    return Path(os.environ.get(SITE_DIR_ENV) or SITE_DIR)


def is_shipped(path: Path) -> bool:
    return path.resolve().parent == shipped_dir().resolve()


def untrusted_reason(path: Path, st: os.stat_result | None = None) -> str | None:
    """Why this file (or folder) is not trusted policy, with the command that fixes it; None when
    it is. Checked: the resolved path and every folder above it. A folder above the file's own
    may be world-writable when it is sticky (/tmp): others cannot rename what they do not own."""
    real = Path(os.path.realpath(path))
    trusted_uids = {0, os.geteuid()}
    for i, p in enumerate([real, *real.parents]):
        try:
            s = st if i == 0 and st is not None else os.lstat(p)
        except OSError as e:
            return f"cannot check {p} ({e.strerror or e})"
        if s.st_uid not in trusted_uids:
            return f"{p} is owned by uid {s.st_uid}, not root; fix: chown root {p}"
        sticky_above = i >= 2 and stat.S_ISDIR(s.st_mode) and s.st_mode & stat.S_ISVTX
        if s.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_above:
            who = {stat.S_IWGRP: "its group", stat.S_IWOTH: "others"}.get(
                s.st_mode & (stat.S_IWGRP | stat.S_IWOTH), "group and others"
            )
            return f"{p} is writable by {who} (mode {stat.S_IMODE(s.st_mode):04o}); fix: chmod go-w {p}"
    return None


def _kind(mode: int) -> str:
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def read_rule_file(path: Path, trusted: bool) -> str:
    """The text of one rule file, bounded; trusted: also refuse it unless it is trusted policy."""
    try:
        real = Path(os.path.realpath(path))
        before = os.lstat(real)  # refuse devices before opening: opening some has effects
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    if not stat.S_ISREG(before.st_mode):
        raise RuleFileError([f"{path}: {_kind(before.st_mode)}, not a regular file; a rule file must be one"])
    _refuse_kernel_fs(path, real)  # before opening too: opening a kernel file can have effects
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    try:
        st = os.fstat(fd)  # what was opened, not what the name pointed at a moment before
        if not stat.S_ISREG(st.st_mode):
            raise RuleFileError([f"{path}: {_kind(st.st_mode)}, not a regular file; a rule file must be one"])
        _refuse_kernel_fs(path, fd)
        if trusted and (why := untrusted_reason(real, st)):
            raise RuleFileError([f"{path}: not trusted policy: {why}"])
        data = read_at_most(fd, MAX_BYTES + 1, path)
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:
        size = f" ({st.st_size} bytes)" if st.st_size > MAX_BYTES else ""
        raise RuleFileError([f"{path}: larger than the {MAX_BYTES >> 20} MiB limit for a rule file{size}"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise RuleFileError([f"{path}:{line}: not UTF-8 text (byte {e.start})"]) from None


def _refuse_kernel_fs(path: Path, file: int | Path) -> None:
    try:
        fs = kernel_fs(file)
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    if fs:
        raise RuleFileError([f"{path}: a file of {fs} (a kernel interface), not a rule file; refused unread"])


def read_at_most(fd: int, limit: int, path: Path) -> bytes:
    """At most limit bytes of fd; any error of the read (EAGAIN, EIO...) as a rule-file error."""
    chunks, total = [], 0
    while total < limit:
        try:
            chunk = os.read(fd, min(1 << 16, limit - total))
        except OSError as e:
            raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


class _StatFs(ctypes.Structure):
    # f_type is the first field of struct statfs: __fsword_t (a long), an unsigned int on s390x;
    # the rest is room enough for the whole struct (120 bytes on x86-64)
    _fields_ = [
        ("f_type", ctypes.c_uint if platform.machine() == "s390x" else ctypes.c_long),
        ("rest", ctypes.c_byte * 256),
    ]


_libc = ctypes.CDLL(None, use_errno=True)


def kernel_fs(file: int | Path) -> str | None:
    """The name of the kernel filesystem a file (an fd, or a path) is on: procfs, sysfs, tracefs...;
    None for a filesystem that stores files. statfs's f_type asks the kernel about the file itself
    (the fd: what was opened, no name to race); no mount table to parse, right for bind mounts and
    btrfs subvolumes. Python's os.statvfs lacks f_type, so libc's through ctypes."""
    buf = _StatFs()
    if isinstance(file, int):
        rc = _libc.fstatfs(file, ctypes.byref(buf))
    else:
        rc = _libc.statfs(os.fsencode(file), ctypes.byref(buf))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return _KERNEL_FS.get(buf.f_type & 0xFFFFFFFF)


def folder_entries(folder: Path, trusted: bool) -> list[Path]:
    """The *.yaml files of a folder of playbooks, sorted; a trusted folder must itself be trusted
    (each entry is checked when it is read)."""
    if not folder.is_dir():
        raise RuleFileError([f"{folder}: not a folder of playbooks"])
    if trusted and (why := untrusted_reason(folder)):
        raise RuleFileError([f"{folder}: not trusted policy: {why}"])
    try:
        return sorted(folder.glob("*.yaml"))
    except OSError as e:
        raise RuleFileError([f"{folder}: cannot list ({e.strerror or e})"]) from None
