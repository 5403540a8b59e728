"""OOM kills recorded in the kernel log (/dev/kmsg): victim, trigger, constraint and memory cgroup.

The kernel prints, for every OOM kill (format stable since Linux 4.19, mm/oom_kill.c):
  ``<comm> invoked oom-killer: gfp_mask=..., order=0, oom_score_adj=0``
  ``CPU: 1 PID: 4242 Comm: <comm> ...``                       (the trigger's context)
  ``oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/x,task_memcg=/x,task=hog,pid=4242,uid=0``
  ``Memory cgroup out of memory: Killed process 4242 (hog) total-vm:..kB, anon-rss:..kB, ...``
The log survives the victim, which is why it is read: the evidence of a 2 a.m. kill is here."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from . import clock
from ._parse import Fact

_INVOKED = re.compile(r"^(?P<comm>.+?) invoked oom-killer:")
_CPU_LINE = re.compile(r"^CPU: \d+ (?:UID: \d+ )?PID: (?P<pid>\d+) Comm: (?P<comm>\S+)")
_SUMMARY = re.compile(r"^oom-kill:(?P<fields>\S+)")
_KILLED = re.compile(
    r"^(?P<kind>Memory cgroup out of memory|Out of memory(?: \(oom_kill_allocating_task\))?): "
    r"Killed process (?P<pid>\d+) \((?P<comm>.*)\) (?P<rest>.*)$"
)
_SIZE = re.compile(r"(?P<key>total-vm|anon-rss|file-rss|shmem-rss):(?P<kib>\d+)kB")


class OomKill(Fact):
    """One OOM kill. ``when`` is seconds since the epoch (from the log's monotonic stamp)."""

    when: float | None = None
    victim_pid: int
    victim_comm: str
    constraint: str | None = None  # CONSTRAINT_NONE (system), CONSTRAINT_MEMCG, CONSTRAINT_CPUSET ...
    oom_memcg: str | None = None  # the cgroup whose limit was hit (memcg OOM)
    task_memcg: str | None = None  # the victim's cgroup
    trigger_comm: str | None = None
    trigger_pid: int | None = None
    anon_rss: int | None = None
    file_rss: int | None = None
    shmem_rss: int | None = None
    total_vm: int | None = None

    @property
    def cgroup_oom(self) -> bool:
        return self.constraint == "CONSTRAINT_MEMCG"


def parse_kmsg_records(records: list[tuple[float | None, str]]) -> list[OomKill]:
    """OOM kills from (timestamp, message) records in log order."""
    kills = []
    trigger_comm: str | None = None
    trigger_pid: int | None = None
    summary: dict[str, str] = {}
    for when, message in records:
        if m := _INVOKED.match(message):
            trigger_comm, trigger_pid, summary = m["comm"], None, {}
        elif (m := _CPU_LINE.match(message)) and trigger_comm is not None and trigger_pid is None:
            trigger_pid = int(m["pid"])
        elif m := _SUMMARY.match(message):
            summary = dict(f.split("=", 1) for f in m["fields"].split(",") if "=" in f)
        elif m := _KILLED.match(message):
            sizes = {s["key"]: int(s["kib"]) * 1024 for s in _SIZE.finditer(m["rest"])}
            constraint = summary.get("constraint")
            if constraint is None:
                constraint = "CONSTRAINT_MEMCG" if m["kind"].startswith("Memory cgroup") else None
            kills.append(
                OomKill(
                    when=when,
                    victim_pid=int(m["pid"]),
                    victim_comm=m["comm"],
                    constraint=constraint,
                    oom_memcg=summary.get("oom_memcg"),
                    task_memcg=summary.get("task_memcg"),
                    trigger_comm=trigger_comm,
                    trigger_pid=trigger_pid,
                    anon_rss=sizes.get("anon-rss"),
                    file_rss=sizes.get("file-rss"),
                    shmem_rss=sizes.get("shmem-rss"),
                    total_vm=sizes.get("total-vm"),
                )
            )
            trigger_comm, trigger_pid, summary = None, None, {}
    return kills


def parse_kmsg_line(raw: str) -> tuple[float | None, str] | None:
    """A /dev/kmsg record ``prio,seq,usec,flags[,...];message`` into (seconds since boot, message)."""
    head, sep, message = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
    return (usec / 1e6 if usec is not None else None), message.split("\n", 1)[0]


def read_oom_kills(path: Path = Path("/dev/kmsg")) -> list[OomKill] | None:
    """Every OOM kill still in the kernel's ring buffer; None when the log cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records: list[tuple[float | None, str]] = []
    # The log's stamps are local_clock(), which tracks CLOCK_MONOTONIC; map them to wall time.
    offset = clock.boot_offset()
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                if e.errno in (errno.EAGAIN, errno.EINVAL):
                    break
                raise
            if not chunk:
                break
            parsed = parse_kmsg_line(chunk.decode("utf-8", "replace"))
            if parsed is not None:
                since_boot, message = parsed
                records.append((since_boot + offset if since_boot is not None else None, message))
    finally:
        os.close(fd)
    return parse_kmsg_records(records)
