"""Where policy may come from, and how a rule file's bytes are read.

memdiag runs as root and a rule file decides verdicts, so policy is read only from trusted places:
the shipped playbook, the site folder (/etc/memdiag/playbooks, or $MEMDIAG_PLAYBOOK_DIR) and
--playbook paths, each owned by root (or the user memdiag runs as) and not writable by group or
others, up every folder to /. Nothing is read from the working folder unless named.

Every rule file, trusted or only linted, is read the same bounded way: a regular file (a FIFO,
a device or a folder is refused before it is opened), opened without following a symlink and
without blocking, at most MAX_BYTES read."""

from __future__ import annotations

import os
import stat
from importlib.resources import files
from pathlib import Path

MAX_BYTES = 1 << 20  # a playbook is a few KiB; a 1 MiB cap still parses in well under a second
SITE_DIR = Path("/etc/memdiag/playbooks")
SITE_DIR_ENV = "MEMDIAG_PLAYBOOK_DIR"

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

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors

    def usage_text(self) -> str:
        """One line for one error; a list for several."""
        if len(self.errors) == 1:
            return f"bad rule file: {self.errors[0]}"
        return "bad rule files:\n" + "\n".join(f"  {line}" for line in self.errors)


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
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    try:
        st = os.fstat(fd)  # what was opened, not what the name pointed at a moment before
        if not stat.S_ISREG(st.st_mode):
            raise RuleFileError([f"{path}: {_kind(st.st_mode)}, not a regular file; a rule file must be one"])
        if trusted and (why := untrusted_reason(real, st)):
            raise RuleFileError([f"{path}: not trusted policy: {why}"])
        data = _read_at_most(fd, MAX_BYTES + 1)
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


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks, total = [], 0
    while total < limit:
        chunk = os.read(fd, min(1 << 16, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


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
