"""A process's memory mappings (/proc/PID/maps), kept so that addresses can be symbolized after
the process has exited, and the one place that decides which file on this host holds what a
mapping maps.

A process in a container (or any mount namespace) maps files that the host may hold at the same
path with other contents. The mapped file is opened as the process maps it: /proc/PID/map_files
names exactly the mapped inode, even deleted or replaced (root reads it); else its path through
/proc/PID/root, else the host's path, each taken only when it is the mapped inode (maps' inode
number) or, beside a readable map_files, has the mapped file's build id. A file that cannot be
matched is no file: the frame stays unknown, and the reason is counted in `unmatched`."""

from __future__ import annotations

import bisect
import contextlib
import os
import stat
from collections import Counter
from pathlib import Path

from .elf import elf_info, note_module
from .mapping import Mapping, describe_dropped, parse_maps, read_maps

__all__ = ["AddressSpace", "Mapping", "parse_maps"]


class AddressSpace:
    """The mappings of one process, with a lookup by address and the files they map."""

    def __init__(self, pid: int, mappings: list[Mapping], root: str = "/"):
        self.pid = pid
        self.mappings = mappings
        self.starts = [m.start for m in mappings]
        self.root = root  # the process's root, to open its files (containers)
        # /proc/PID, for map_files; None when the space was not read from a /proc
        self.proc = os.path.dirname(root) if root.endswith("/root") else None
        self._files: dict[str, str | None] = {}  # mapping path -> the file that holds it (None: none)
        self._held: dict[str, int] = {}  # mapping path -> an open descriptor of its file (hold())
        self.unmatched: Counter[str] = Counter()  # why a mapped file had no file: reason -> look-ups

    @classmethod
    def of(cls, pid: int, proc_root: Path = Path("/proc")) -> AddressSpace | None:
        maps = read_maps(pid, proc_root)
        if maps is None:
            return None
        dropped = describe_dropped(maps)
        if dropped:
            note_module(f"/proc/{pid}/maps", dropped)
        return cls(pid, maps, root=str(proc_root / str(pid) / "root"))

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None

    def file_path(self, mapping: Mapping | None) -> str | None:
        """A path on this host whose contents are the file this mapping maps, or None (counted
        in `unmatched`): never a different file that happens to have the same path."""
        if mapping is None or not mapping.is_file:
            return None
        found = self._files.get(mapping.path, "")
        # unresolved, or resolved while the process lived and gone with its /proc entries
        if found == "" or (found is not None and not os.path.exists(found)):
            found = self._files[mapping.path] = self._resolve(mapping)
        if found is None:
            self.unmatched[f"{mapping.path}: no file on this host is the one PID {self.pid} maps"] += 1
        return found

    def inode_path(self, mapping: Mapping | None) -> str | None:
        """A path to the very inode this mapping maps, for uprobes: they attach to an inode, and
        another file of the same build (a container's copy of the host's libc) never fires. The
        file file_path found when it is that inode (through overlayfs, the layer's inode number),
        else map_files, which the kernel follows to the mapped inode."""
        found = self.file_path(mapping)
        if found is None or mapping is None:
            return None
        mapped = self._mapped(self.first_mapping_of(mapping.path) or mapping)
        exact, st = _stat(mapped) if mapped else None, _stat(found)
        if exact is None or (st is not None and st.st_ino == exact.st_ino):
            return found
        return mapped

    def _mapped(self, first: Mapping) -> str | None:
        held = self._held.get(first.path)
        if held is not None:
            return f"/proc/self/fd/{held}"
        return _map_file(self.proc, first) if self.proc else None

    def _resolve(self, mapping: Mapping) -> str | None:
        first = self.first_mapping_of(mapping.path) or mapping
        mapped = self._mapped(first)
        # None: exited, or map_files not readable (no CAP_SYS_ADMIN in memdiag's namespace)
        exact = _stat(mapped) if mapped else None
        want = (exact.st_dev, exact.st_ino) if exact else (first.dev, first.inode) if first.inode else None
        inside = self.root + mapping.path
        for path in () if mapping.deleted else (mapping.path, inside):
            st = _stat(path)
            if st is None or not stat.S_ISREG(st.st_mode):  # a FIFO or device planted since: never opened
                continue
            if (st.st_dev, st.st_ino) == want:
                return path  # the mapped inode by a stable name: parsed once for every process
            if exact is None and path == inside and st.st_ino == first.inode:
                return path  # through overlayfs: the layer's inode number, the overlay's device
            if exact is not None and _same_build(path, mapped):
                return path
        return mapped if exact else None

    def orphan(self) -> None:
        """The process these mappings were read from is not the target any more (it exited, its
        pid may be another's, or it exec'd): its /proc entries lead to whatever holds that pid
        now, so they are never opened again. Files already held stay; others are taken only from
        the host by the mapped inode that maps said (system/identity.py)."""
        proc = f"/proc/{self.pid}/"
        self.proc, self.root = None, "/"
        self._files = {k: v for k, v in self._files.items() if v is None or not v.startswith(proc)}

    def hold(self) -> AddressSpace:
        """Open the executable mappings' files now, while the process lives: a process about to
        exit (an OOM victim) takes its map_files and root with it. Each held file is then read
        as /proc/self/fd/N until close()."""
        for m in self.mappings:
            if self.proc and m.executable and m.is_file and m.path not in self._held:
                first = self.first_mapping_of(m.path) or m
                with contextlib.suppress(OSError):
                    self._held[m.path] = os.open(_map_file(self.proc, first), os.O_RDONLY | os.O_CLOEXEC)
        return self

    def close(self) -> None:
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()
        self._files.clear()  # a descriptor's number may be reused for another file

    def __del__(self) -> None:
        self.close()

    def first_mapping_of(self, path: str) -> Mapping | None:
        return next((m for m in self.mappings if m.path == path), None)

    def modules(self) -> list[str]:
        return sorted({m.path for m in self.mappings if m.is_file})


def _map_file(proc: str, m: Mapping) -> str:
    return f"{proc}/map_files/{m.start:x}-{m.end:x}"


def _stat(path: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except OSError:
        return None


def _same_build(path: str, mapped: str | None) -> bool:
    """Both files carry the same GNU build id (an overlayfs path and its lower inode differ in
    device and inode number, not in contents); no build id on either side is no match."""
    a, b = elf_info(path), elf_info(mapped) if mapped else None
    bid = a.build_id() if a else None
    return bid is not None and b is not None and b.build_id() == bid
