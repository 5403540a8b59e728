"""A process's resident memory by mapping, from /proc/PID/smaps, as the detail of its ledger's lines:
anonymous memory by where it lives (the brk heap, the main thread's stack, anonymous mappings, named
ones, private pages written in mapped files), file-backed memory by file, shared memory by file or
segment (tmpfs files, memfds, System V, shared anonymous mappings). Read line by line and bounded."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ._parse import kib_to_bytes, lines_of, parse_file

MAX_MAPPINGS = 65536  # a process may map hundreds of thousands: the split stops there
TOP = 5

_SHMEM_PREFIXES = ("/dev/shm/", "/memfd:", "/SYSV", "/dev/zero", "/run/shm/")


def _kind(path: str) -> str | None:
    """Which line a mapping's pages other than its anonymous ones count in; None: in none (the
    kernel's special mappings, [vdso] and [vvar], are in no RSS counter)."""
    if path.startswith(_SHMEM_PREFIXES) or path.startswith("[anon_shmem:") or not path:
        return "shmem"  # an anonymous mapping's pages that are not Anonymous are shared (MAP_SHARED)
    if path.startswith("/"):
        return "file"
    return None


def _anon_part(path: str) -> str:
    if path == "[heap]":
        return "[heap] (the brk heap)"
    if path == "[stack]":
        return "[stack] (the main thread's)"
    if path.startswith("[anon:"):
        return path  # named by the process (prctl PR_SET_VMA_ANON_NAME)
    if path.startswith("/"):
        return "private pages written in mapped files"
    return "anonymous mappings (mmap: thread stacks, arenas, runtime heaps)"


def split_smaps(text: str | Iterable[str]) -> dict[str, list[tuple[str, int]]]:
    """{"anon" | "file" | "shmem": [(part, bytes)], largest first, at most TOP each} from smaps."""
    sums: dict[str, dict[str, int]] = {"anon": {}, "file": {}, "shmem": {}}
    path, rss, anon, seen = "", 0, 0, 0

    def flush() -> None:
        if seen:
            sums["anon"][_anon_part(path)] = sums["anon"].get(_anon_part(path), 0) + anon
            rest, kind = rss - anon, _kind(path)
            if rest > 0 and kind is not None:
                name = path.removesuffix(" (deleted)") or "shared anonymous mappings"
                sums[kind][name] = sums[kind].get(name, 0) + rest

    for line in lines_of(text):
        first = line.split(None, 1)[0] if line.strip() else ""
        if "-" in first and not first.endswith(":"):
            flush()
            seen += 1
            if seen > MAX_MAPPINGS:
                seen -= 1
                break
            head = line.split(None, 5)
            path, rss, anon = (head[5].strip() if len(head) > 5 else ""), 0, 0
        elif first == "Rss:":
            rss = kib_to_bytes(line[len(first) :]) or 0
        elif first == "Anonymous:":
            anon = kib_to_bytes(line[len(first) :]) or 0
    flush()
    return {k: sorted(((n, b) for n, b in v.items() if b), key=lambda x: -x[1])[:TOP] for k, v in sums.items()}


def read_smaps_split(pid: int, root: Path = Path("/proc")) -> dict[str, list[tuple[str, int]]] | None:
    """The split now; None when the process is gone or its smaps unreadable."""
    return parse_file(root / str(pid) / "smaps", split_smaps)
