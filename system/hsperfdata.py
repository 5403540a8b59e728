"""A HotSpot JVM's own performance counters, read without attaching: the hsperfdata file the JVM
keeps mapped at /tmp/hsperfdata_<user>/<pid> (jstat and jps read the same). It is read through
/proc/PID/root, so a JVM in a container is found in its own /tmp, under the pid its own pid
namespace gives it (NSpid).

The format (HotSpot's perfMemory.hpp, PerfData version 2.0): a 32-byte prologue — magic bytes
CA FE C0 C0, byte order (0 big, 1 little endian), major and minor version, accessible (1 once the
JVM has initialised), bytes used, overflow, time of the last structural change, offset of the
first entry and number of entries — then the entries, each: length, offset of its name, vector
length (0 for a scalar), type code ('J' a 64-bit long, 'B' a byte vector: strings), flags, units
(1 none, 2 bytes, 3 ticks, 4 events, 5 string, 6 hertz), variability (1 constant, 2 monotonic,
3 variable) and the offset of its data. Times are ticks of `sun.os.hrt.frequency` per second.

The file is the target's to write: it is opened inside the target's own root (safefile: no link
leaves it, no FIFO, a regular file of the target's user), read up to MAX_FILE, and decoded within
bounds a hostile file cannot stretch: at most MAX_ENTRIES entries, each at least an entry header
long (entries may not overlap backwards), names of at most MAX_NAME bytes, strings of at most
MAX_STRING, and MAX_DECODED bytes of names and strings in all (65,534 entries naming one shared
2 MiB string would otherwise decode 128 GiB). Past a bound the decoding stops, what was read is kept
and `skipped` counts the rest.

No file: the JVM runs with -XX:-UsePerfData (no counters at all) or -XX:+PerfDisableSharedMem
(counters in its own memory only), or it is no HotSpot JVM; `perfdata_absence` says which."""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ._parse import Fact, read_text
from .cgroup import on_fuse, parse_mountinfo
from .process import effective_uid, innermost_pid
from .safefile import names_in, open_dir_in, open_in, open_root, read_fd

MAGIC = b"\xca\xfe\xc0\xc0"
_PROLOGUE = "bbbbiiqii"  # after the magic: order, major, minor, accessible, used, overflow, mod time, offset, count
_ENTRY = "iiibbbbi"  # length, name offset, vector length, type, flags, units, variability, data offset
_ENTRY_SIZE = struct.calcsize("<" + _ENTRY)
MAX_FILE = 4 << 20  # the JVM sizes it with -XX:PerfDataMemorySize (32 KiB by default)
# A JVM here keeps ~190 counters in its 32 KiB; the largest -XX:PerfDataMemorySize a JVM would be
# given holds a few thousand. More is no JVM's file.
MAX_ENTRIES = 8192
MAX_NAME = 256  # counter names are dotted paths (the longest here: 43 bytes)
MAX_STRING = 64 << 10  # HotSpot cuts its strings at -XX:PerfMaxStringConstLength (1 KiB by default)
MAX_STATUS = 64 << 10  # /proc/PID/status: ~1.5 KiB; its Name: line is the target's to choose
MAX_FOLDERS = 256  # /tmp/hsperfdata_<user> folders looked into: one per user running a JVM there
MAX_DECODED = 1 << 20  # names and strings in all: 0.7 KiB of strings here; 1 MiB is what one read may cost


class PerfData(Fact):
    """Every counter of one read of the file: name -> value (an int, or a string)."""

    major: int
    minor: int
    accessible: bool
    entries: dict[str, int | str]
    skipped: int = 0  # entries of a type this reader does not decode, or out of the file's bounds

    def number(self, name: str) -> int | None:
        v = self.entries.get(name)
        return v if isinstance(v, int) else None

    def text(self, name: str) -> str | None:
        v = self.entries.get(name)
        return v if isinstance(v, str) else None


def parse_perfdata(data: bytes) -> PerfData | None:
    """The counters of an hsperfdata file's bytes; None when it is not one (magic, version)."""
    if len(data) < 32 or data[:4] != MAGIC or data[4] not in (0, 1):
        return None
    order = "<" if data[4] == 1 else ">"
    _o, major, minor, accessible, used, _ovf, _mod, offset, count = struct.unpack_from(order + _PROLOGUE, data, 4)
    if major != 2:  # version 1 (JDK 1.4) laid entries out otherwise
        return None
    end = min(len(data), used) if used > 0 else len(data)
    entries: dict[str, int | str] = {}
    skipped = 0
    budget = MAX_DECODED
    for i in range(min(max(0, count), MAX_ENTRIES)):
        if offset < 32 or offset + _ENTRY_SIZE > end:
            break
        length, name_off, vlen, dtype, _flags, units, _var, data_off = struct.unpack_from(order + _ENTRY, data, offset)
        if length < _ENTRY_SIZE:  # an entry shorter than its own header: the next would overlap it
            break
        value = _value(data, order, offset, end, name_off, vlen, dtype, units, data_off)
        cost = len(value[0]) + (len(value[1]) if isinstance(value[1], str) else 8) if value else 0
        if value is not None and cost > budget:
            skipped += max(0, count) - i  # the file names more than one read may decode: the rest is left
            break
        if value is None:
            skipped += 1
        else:
            budget -= cost
            entries[value[0]] = value[1]
        offset += length
    else:
        skipped += max(0, max(0, count) - MAX_ENTRIES)
    return PerfData(major=major, minor=minor, accessible=bool(accessible), entries=entries, skipped=skipped)


def _value(data: bytes, order: str, at: int, end: int, name_off: int, vlen: int, dtype: int, units: int, data_off: int):
    """(name, value) of one entry, or None when its type is not decoded or it runs past the end."""
    name_at, value_at = at + name_off, at + data_off
    if name_off < 0 or data_off < 0 or name_at >= end:
        return None
    nul = data.find(b"\0", name_at, min(end, name_at + MAX_NAME + 1))
    if nul < 0:
        return None  # no name, or one longer than any counter's
    name = data[name_at:nul].decode("ascii", "replace")
    if dtype == ord("J") and vlen == 0 and value_at + 8 <= end:
        return name, struct.unpack_from(order + "q", data, value_at)[0]
    if dtype == ord("B") and 0 < vlen <= MAX_STRING and value_at + vlen <= end and units == 5:
        stop = data.find(b"\0", value_at, value_at + vlen)
        return name, data[value_at : stop if stop >= 0 else value_at + vlen].decode("utf-8", "replace")
    return None


def perfdata_path(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The target's hsperfdata file, as the target names it: /tmp/hsperfdata_<user>/<nspid> in its
    own root (resolved inside that root), a regular file owned by the target's effective user
    (several users' folders may hold a file of that pid: other containers, a reused pid). None: no
    such file."""
    found = _open_perfdata(pid, proc_root)
    if found is None:
        return None
    os.close(found[1])
    return found[0]


def _open_perfdata(pid: int, proc_root: Path) -> tuple[str, int] | None:
    """(path in the target's root, an open descriptor) of its newest hsperfdata file."""
    status = read_text(proc_root / str(pid) / "status", MAX_STATUS)
    if status is None:
        return None
    nspid = innermost_pid(status) or pid
    euid = effective_uid(status)
    try:
        root = open_root(proc_root / str(pid) / "root")
    except OSError:
        return None
    best: tuple[float, str, int] | None = None
    try:
        try:
            tmp = open_dir_in(root, "/tmp")
        except OSError:
            return None
        try:
            folders = sorted(names_in(tmp, "hsperfdata_"))
        except OSError:
            folders = []
        finally:
            os.close(tmp)
        for folder in folders[:MAX_FOLDERS]:
            path = f"/tmp/{folder}/{nspid}"
            try:
                fd = open_in(root, path, follow_leaf=False, owner=euid)
            except OSError:
                continue
            mtime = os.fstat(fd).st_mtime
            if best is None or mtime > best[0]:
                if best is not None:
                    os.close(best[2])
                best = (mtime, path, fd)
            else:
                os.close(fd)
    finally:
        os.close(root)
    return (best[1], best[2]) if best else None


def perfdata_behind_fuse(pid: int, proc_root: Path = Path("/proc")) -> bool:
    """Whether the path to the target's hsperfdata (/tmp/hsperfdata_<user>/<pid> in its root) crosses
    a FUSE mount in its own mount table, or the table cannot be read: a FUSE daemon is the target's
    to answer, and one that never answers would hold the reader for ever."""
    text = read_text(proc_root / str(pid) / "mountinfo", 1 << 20)
    if text is None:
        return True
    return on_fuse(parse_mountinfo(text), "/tmp", below=True)


def read_perfdata(pid: int, proc_root: Path = Path("/proc")) -> PerfData | None:
    """The target's counters now; None when it has no hsperfdata file (perfdata_absence says why)."""
    found = _open_perfdata(pid, proc_root)
    if found is None:
        return None
    try:
        data, _ = read_fd(found[1], MAX_FILE)
    except OSError:
        return None
    finally:
        os.close(found[1])
    return parse_perfdata(data)


def perfdata_absence(pid: int, proc_root: Path = Path("/proc")) -> str:
    """Why a JVM has no counters file: the flag that turned it off, where it was given."""
    base = proc_root / str(pid)
    cmdline = (read_proc_args(base / "cmdline") or b"").decode("utf-8", "replace").split("\0")
    environ = (read_proc_args(base / "environ") or b"").decode("utf-8", "replace").split("\0")
    options = [e.split("=", 1)[1] for e in environ if e.split("=", 1)[0] in _OPTION_VARIABLES and "=" in e]
    words = cmdline + " ".join(options).split()
    if "-XX:-UsePerfData" in words:
        return "the JVM runs with -XX:-UsePerfData: it keeps no performance counters"
    if "-XX:+PerfDisableSharedMem" in words:
        return "the JVM runs with -XX:+PerfDisableSharedMem: its counters are in its own memory, not in a file"
    return f"no hsperfdata file for this JVM in its /tmp/hsperfdata_<user>/ (looked through {base}/root)"


_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")


# A process's command line and environment as /proc shows them: the kernel caps what execve takes
# at 6 MiB (3/4 of the default 8 MiB stack limit), so 8 MiB reads all of a real one.
MAX_PROC_ARGS = 8 << 20


def read_proc_args(path: Path) -> bytes | None:
    """/proc/PID/cmdline or environ, at most MAX_PROC_ARGS bytes (the target may rewrite its own)."""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_PROC_ARGS)
    except OSError:
        return None
