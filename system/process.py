"""One process's memory from /proc/PID/{status,stat,smaps_rollup,cmdline}: RSS split into
anon/file/shmem (RSS, not VSZ, is what the process holds), swap, high-water mark, faults."""

from __future__ import annotations

import os
from pathlib import Path

from ._parse import Fact, int_or_none, kib_to_bytes, kv_lines, read_text

# A command line is the target's to make as long as its stack limit allows (hundreds of MiB under
# `ulimit -s unlimited`); reports quote a few words of it, and what is read is kept per sample.
MAX_CMDLINE = 64 << 10


class ProcessGone(Exception):
    """The process does not exist (or exited between two reads)."""

    def __init__(self, pid: int):
        super().__init__(f"process {pid} does not exist")
        self.pid = pid


class ProcessMemory(Fact):
    pid: int
    comm: str
    cmdline: list[str]
    state: str | None = None
    ppid: int | None = None  # tells memdiag's own children (its BPF compiler) from the processes it watches
    rss: int | None = None
    rss_anon: int | None = None
    rss_file: int | None = None
    rss_shmem: int | None = None
    vm_swap: int | None = None
    vm_hwm: int | None = None
    vm_size: int | None = None
    vm_pte: int | None = None  # its page tables: kernel memory its mappings cost, not in RSS
    pss: int | None = None
    threads: int | None = None
    minflt: int | None = None
    majflt: int | None = None
    start_ticks: int | None = None  # field 22 of stat: tells a reused pid from the original
    ns_pid: int | None = None  # the pid its own (innermost) pid namespace gives it: a container's pid; None: unknown


def innermost_pid(status: str) -> int | None:
    """The last field of status's NSpid line (4.1+): the pid as the process's own pid namespace
    numbers it, the same as the host's outside any container. None: no such line."""
    line = next((x for x in status.splitlines() if x.startswith("NSpid:")), None)
    fields = line.split()[1:] if line else []
    return int_or_none(fields[-1]) if fields else None


def _effective(status: str) -> dict[str, int]:
    """The effective ids of status's Uid and Gid lines (real, effective, saved, fs), as the host
    numbers them: {'Uid': n, 'Gid': n}, a line missing or not a number left out."""
    found: dict[str, int] = {}
    for line in status.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Uid", "Gid"):
            fields = rest.split()
            if len(fields) > 1 and fields[1].isdigit():
                found[key] = int(fields[1])
    return found


def effective_uid(status: str) -> int | None:
    return _effective(status).get("Uid")


def effective_ids(status: str) -> tuple[int, int] | None:
    """(effective uid, effective gid); None: either line missing."""
    found = _effective(status)
    return (found["Uid"], found["Gid"]) if len(found) == 2 else None


def start_ticks(pid: int | str, root: Path = Path("/proc")) -> int | None:
    """A process's start time in clock ticks after boot (stat's field 22): with its pid, which
    process it is (a reused pid starts later). None: gone. pid may be 'self'."""
    try:
        with open(root / str(pid) / "stat", "rb") as f:
            return int(f.read(4096).rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _parse_stat(text: str) -> dict[str, int | str | None]:
    # comm is in parentheses and may itself contain spaces and ')': split at the LAST ')'.
    lpar, rpar = text.find("("), text.rfind(")")
    if lpar < 0 or rpar < 0:
        return {}
    comm = text[lpar + 1 : rpar]
    rest = text[rpar + 2 :].split()

    # rest[0] is field 3 (state); field N is rest[N - 3]
    def field(n: int) -> int | None:
        return int_or_none(rest[n - 3]) if len(rest) > n - 3 else None

    return {
        "comm": comm,
        "state": rest[0] if rest else None,
        "minflt": field(10),
        "majflt": field(12),
        "threads": field(20),
        "start_ticks": field(22),
    }


def stat_identity(text: str) -> tuple[str, int] | None:
    """(comm, start ticks) of a /proc/PID/stat: what tells one process from a later one of its pid."""
    f = _parse_stat(text)
    comm, start = f.get("comm"), f.get("start_ticks")
    return (comm, start) if isinstance(comm, str) and isinstance(start, int) else None


def parse_process(
    pid: int, status: str, stat: str | None, smaps_rollup: str | None, cmdline: str | None
) -> ProcessMemory:
    st = kv_lines(status, sep=":")
    parsed = _parse_stat(stat) if stat else {}
    rollup = kv_lines(smaps_rollup, sep=":") if smaps_rollup else {}
    argv = [a for a in (cmdline or "").split("\0") if a]
    return ProcessMemory(
        pid=pid,
        comm=st.get("Name") or str(parsed.get("comm") or ""),
        cmdline=argv,
        state=(st.get("State") or "").split(" ")[0] or None,
        ppid=int_or_none(st.get("PPid")),
        rss=kib_to_bytes(st.get("VmRSS")),
        rss_anon=kib_to_bytes(st.get("RssAnon")),
        rss_file=kib_to_bytes(st.get("RssFile")),
        rss_shmem=kib_to_bytes(st.get("RssShmem")),
        vm_swap=kib_to_bytes(st.get("VmSwap")),
        vm_hwm=kib_to_bytes(st.get("VmHWM")),
        vm_size=kib_to_bytes(st.get("VmSize")),
        vm_pte=kib_to_bytes(st.get("VmPTE")),
        pss=kib_to_bytes(rollup.get("Pss")),
        threads=int_or_none(st.get("Threads")) or parsed.get("threads"),  # type: ignore[arg-type]
        minflt=parsed.get("minflt"),  # type: ignore[arg-type]
        majflt=parsed.get("majflt"),  # type: ignore[arg-type]
        start_ticks=parsed.get("start_ticks"),  # type: ignore[arg-type]
        ns_pid=innermost_pid(status),
    )


def read_process(pid: int, root: Path = Path("/proc")) -> ProcessMemory:
    """Raise ProcessGone if the process does not exist. A zombie has no memory lines: its RSS is None."""
    base = root / str(pid)
    status = read_text(base / "status")
    if status is None:
        raise ProcessGone(pid)
    return parse_process(
        pid,
        status,
        read_text(base / "stat"),
        read_text(base / "smaps_rollup"),
        read_text(base / "cmdline", MAX_CMDLINE),
    )


def read_rss_anon(pid: int, root: Path = Path("/proc")) -> int | None:
    """RssAnon from /proc/PID/status alone: no smaps walk (no hold on the target's memory map), the
    read a sampler repeats every second. None when the process is gone or the line is missing."""
    status = read_text(root / str(pid) / "status")
    return None if status is None else kib_to_bytes(kv_lines(status, sep=":").get("RssAnon"))


def cpu_seconds(pid: int, root: Path = Path("/proc")) -> float | None:
    """CPU time the process has used, all its threads, user + system (stat fields 14 and 15).
    Uprobe traps and the BPF programs they run are charged to the trapping thread as system time,
    so this is where a traced target's overhead shows, whatever the probe. None: gone."""
    text = read_text(root / str(pid) / "stat")
    if text is None:
        return None
    rest = text[text.rfind(")") + 2 :].split()
    if len(rest) < 13:
        return None
    return (int(rest[11]) + int(rest[12])) / _CLK_TCK


_CLK_TCK = os.sysconf("SC_CLK_TCK")
