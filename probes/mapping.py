"""One line of /proc/PID/maps, parsed: the lowest part of symbolization, which the ELF reader
(elf.py: a module's load bias) and the address spaces (procmaps.py) both read."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# A process chooses how many mappings it has (the kernel's vm.max_map_count, 65,530 by default, is
# a host setting root may raise): 300,000 of them cost memdiag 299 MB as objects before this. Kept:
# MAX_CODE_MAPPINGS of code and files (executable, file-backed or named: what names frames), and
# MAX_DATA_MAPPINGS of anonymous data; past those the process's other mappings are not kept (their
# addresses symbolize as outside any mapping) and `dropped` counts them. At most ~230 bytes a mapping
# kept (slots, shared path strings): 2 x 65,536 ~ 30 MiB. Lines past MAX_LINES are not read.
MAX_CODE_MAPPINGS = 65_536
MAX_DATA_MAPPINGS = 65_536
MAX_LINES = 1 << 20  # reading /proc/PID/maps costs the kernel ~1 us a line: ~1 s at most


@dataclass(frozen=True, slots=True)  # slots: ~230 bytes a mapping, not ~600 with a __dict__
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str  # "" for anonymous memory, "[heap]", "[stack]", or a file
    inode: int = 0  # the mapped file's inode number as maps shows it (0: anonymous or unknown)
    dev: int = 0  # and its device (under overlayfs: the layer's device, not the overlay's)
    deleted: bool = False  # maps said "(deleted)": the path no longer names the mapped file

    @property
    def is_file(self) -> bool:
        return self.path.startswith("/")

    @property
    def executable(self) -> bool:
        return "x" in self.perms


class Mappings(list):
    """parse_maps' answer: the mappings kept, by start; `dropped`: how many were not kept past the
    bounds; `unread`: lines past MAX_LINES were not read."""

    dropped = 0
    unread = False


def parse_maps(text: str | Iterable[str], bounded: bool = True) -> Mappings:
    """The mappings of maps' text (or its lines), bounded: see MAX_CODE_MAPPINGS (not bounded: every
    line, for a reader that must see every region, the reachability scan). A line that is not a
    mapping is skipped."""
    lines = iter(text.splitlines() if isinstance(text, str) else text)
    out = Mappings()
    shared: dict[str, str] = {}  # one string per path and perms: a library's path is on 4-5 lines
    code = data = 0
    for line in itertools.islice(lines, MAX_LINES) if bounded else lines:
        m = _mapping(line, shared)
        if m is None:
            continue
        is_code = bool(m.path) or m.executable
        if bounded and (code if is_code else data) >= (MAX_CODE_MAPPINGS if is_code else MAX_DATA_MAPPINGS):
            out.dropped += 1
            continue
        code, data = (code + 1, data) if is_code else (code, data + 1)
        out.append(m)
    out.unread = next(lines, None) is not None
    out.sort(key=lambda m: m.start)
    return out


def describe_dropped(maps: Mappings) -> str | None:
    """One line on what the bounds left out, or None: every mapping kept."""
    if not maps.dropped and not maps.unread:
        return None
    unread = f"; lines past {MAX_LINES:,} not read" if maps.unread else ""
    return (
        f"{maps.dropped:,} mappings not kept (past {MAX_CODE_MAPPINGS:,} of code and files and "
        f"{MAX_DATA_MAPPINGS:,} of anonymous data{unread}): their addresses stay unknown"
    )


def _mapping(line: str, shared: dict[str, str]) -> Mapping | None:
    parts = line.split(None, 5)
    if len(parts) < 5:
        return None
    lo, sep, hi = parts[0].partition("-")
    path = parts[5].strip() if len(parts) == 6 else ""
    deleted = path.endswith(" (deleted)")
    if deleted:
        path = path[: -len(" (deleted)")]
    major, _, minor = parts[3].partition(":")
    try:
        start, end, offset = int(lo, 16), int(hi, 16), int(parts[2], 16)
        inode = int(parts[4]) if parts[4].isdigit() else 0
        dev = os.makedev(int(major, 16), int(minor, 16)) if inode else 0
    except (ValueError, OverflowError):  # not a line the kernel writes
        return None
    if not sep:
        return None
    path = shared.setdefault(path, path)
    perms = shared.setdefault(parts[1], parts[1])
    return Mapping(start, end, perms, offset, path, inode, dev, deleted)


def read_maps(pid: int, proc_root: Path = Path("/proc")) -> Mappings | None:
    """The process's mappings, read a line at a time (never its whole text at once), or None: gone."""
    try:
        with open(proc_root / str(pid) / "maps", errors="replace") as f:
            return parse_maps(f)
    except OSError:
        return None
