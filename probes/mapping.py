"""One line of /proc/PID/maps, parsed: the lowest part of symbolization, which the ELF reader
(elf.py: a module's load bias) and the address spaces (procmaps.py) both read."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
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


def parse_maps(text: str) -> list[Mapping]:
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 5:
            continue
        path = parts[5].strip() if len(parts) == 6 else ""
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        try:  # a line not in the kernel's form is no mapping
            lo, hi = parts[0].split("-")
            inode = int(parts[4]) if parts[4].isdigit() else 0
            major, _, minor = parts[3].partition(":")
            dev = os.makedev(int(major, 16), int(minor, 16)) if inode else 0
            out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), path, inode, dev, deleted))
        except (ValueError, OverflowError):
            continue
    return sorted(out, key=lambda m: m.start)
