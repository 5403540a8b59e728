"""System V shared memory segments (/proc/sysvipc/shm, what `ipcs -m` lists): each segment's size,
the memory it holds (rss, swap), who created it and who last used it, how many attach it. A segment
lives until it is removed (IPC_RMID), attached or not: memory no process's RSS counts once they all
detach, in the host's Shmem."""

from __future__ import annotations

import os
from pathlib import Path

from ._parse import Fact, read_text

MAX_SEGMENTS = 4096  # read at most; kernel.shmmni is 4096 by default


class ShmSegment(Fact):
    key: int
    shmid: int
    size: int
    cpid: int  # the creator
    lpid: int  # the last to attach or detach
    nattch: int
    uid: int
    rss: int | None = None  # resident bytes (3.x+; older kernels print no such column)
    swap: int | None = None
    ctime: int | None = None  # its creation (or last IPC_SET), seconds since the epoch


def resident(g: ShmSegment) -> int:
    """The memory a segment holds: its resident bytes, or its size where the kernel prints no rss."""
    return g.rss if g.rss is not None else g.size


def parse_sysvipc_shm(text: str) -> list[ShmSegment]:
    """The segments of /proc/sysvipc/shm's text, by its header's column names."""
    lines = text.splitlines()
    if not lines:
        return []
    cols = lines[0].split()
    out = []
    for line in lines[1 : MAX_SEGMENTS + 1]:
        row = dict(zip(cols, line.split(), strict=False))
        try:
            out.append(
                ShmSegment(
                    key=int(row["key"]), shmid=int(row["shmid"]), size=int(row["size"]), cpid=int(row["cpid"]),
                    lpid=int(row["lpid"]), nattch=int(row["nattch"]), uid=int(row["uid"]),
                    rss=int(row["rss"]) if "rss" in row else None, swap=int(row["swap"]) if "swap" in row else None,
                    ctime=int(row["ctime"]) if "ctime" in row else None,
                )
            )  # fmt: skip
        except (KeyError, ValueError):
            continue
    return out


def read_sysv_shm(root: Path = Path("/proc")) -> list[ShmSegment] | None:
    """The host's segments now (memdiag's IPC namespace); None when the file cannot be read."""
    text = read_text(root / "sysvipc" / "shm", 1 << 20)
    return parse_sysvipc_shm(text) if text is not None else None


def read_ipc_namespace(pid: int | str, root: Path = Path("/proc")) -> str | None:
    """A process's IPC namespace (the text of /proc/PID/ns/ipc, never followed: ipc:[4026531839]);
    None when it cannot be read. /proc/sysvipc/shm lists the segments of the reader's namespace alone."""
    try:
        return os.readlink(root / str(pid) / "ns" / "ipc")
    except OSError:
        return None
