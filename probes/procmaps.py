"""A process's memory mappings (/proc/PID/maps), kept so that addresses can be symbolized after
the process has exited."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str  # "" for anonymous memory, "[heap]", "[stack]", or a file

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
        lo, hi = parts[0].split("-")
        path = parts[5].strip() if len(parts) == 6 else ""
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        out.append(Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), path))
    return sorted(out, key=lambda m: m.start)


class AddressSpace:
    """The mappings of one process, with a lookup by address."""

    def __init__(self, pid: int, mappings: list[Mapping], root: str = "/"):
        self.pid = pid
        self.mappings = mappings
        self.starts = [m.start for m in mappings]
        self.root = root  # the process's root, to open its files (containers)

    @classmethod
    def of(cls, pid: int, proc_root: Path = Path("/proc")) -> AddressSpace | None:
        try:
            text = (proc_root / str(pid) / "maps").read_text()
        except OSError:
            return None
        return cls(pid, parse_maps(text), root=str(proc_root / str(pid) / "root"))

    def find(self, address: int) -> Mapping | None:
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.mappings[i].end:
            return self.mappings[i]
        return None

    def file_path(self, mapping: Mapping) -> str:
        """The mapped file as this process sees it (through /proc/PID/root for containers)."""
        inside = Path(self.root + mapping.path)
        return str(inside) if inside.exists() else mapping.path

    def first_mapping_of(self, path: str) -> Mapping | None:
        return next((m for m in self.mappings if m.path == path), None)

    def modules(self) -> list[str]:
        return sorted({m.path for m in self.mappings if m.is_file})
