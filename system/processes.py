"""Every user process's memory at one moment (kernel threads and vanished pids left out)."""

from __future__ import annotations

from pathlib import Path

from .process import ProcessGone, ProcessMemory, read_process


def list_pids(root: Path = Path("/proc")) -> list[int]:
    try:
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit())
    except OSError:
        return []


def read_all_processes(root: Path = Path("/proc"), pids: list[int] | None = None) -> dict[int, ProcessMemory]:
    out: dict[int, ProcessMemory] = {}
    for pid in list_pids(root) if pids is None else pids:
        try:
            proc = read_process(pid, root)
        except ProcessGone:
            continue
        if proc.rss is None:  # kernel thread or zombie: no user memory
            continue
        out[pid] = proc
    return out
