"""OOM kills recorded in the kernel log (/dev/kmsg): victim, trigger, constraint, memory cgroup, and
the kernel's own account of that cgroup at the kill.

The kernel prints, for every OOM kill (format stable since Linux 4.19, mm/oom_kill.c):
  ``<comm> invoked oom-killer: gfp_mask=..., order=0, oom_score_adj=0``
  ``CPU: 1 PID: 4242 Comm: <comm> ...``                       (the trigger's context)
  ``oom-kill:constraint=CONSTRAINT_MEMCG,...,oom_memcg=/x,task_memcg=/x,task=hog,pid=4242,uid=0``
  ``Memory cgroup out of memory: Killed process 4242 (hog) total-vm:..kB, anon-rss:..kB, ...``
On a memory-cgroup OOM, between the first two and the last two (mem_cgroup_print_oom_meminfo,
mm/memcontrol.c; seen on 6.18 with v1), one record a line:
  ``memory: usage 65536kB, limit 65536kB, failcnt 94``
  ``memory+swap: usage ...kB, limit ...kB, failcnt 0`` and ``kmem: usage ...`` (v1), or
  ``swap: usage ...kB, limit ...kB, failcnt 0`` (v2)
  ``Memory cgroup stats for /x:``, then the cgroup's memory.stat, ``key value`` a record, then
  ``Tasks state (memory values in pages):``
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
# The counters are pages printed as kB (K()); 20 digits hold any u64.
_COUNTER = re.compile(
    r"^(?P<name>memory|memory\+swap|swap|kmem): usage (?P<usage>\d{1,20})kB, limit (?P<limit>\d{1,20})kB, "
    r"failcnt (?P<failcnt>\d{1,20})$"
)
_STATS_FOR = re.compile(r"^Memory cgroup stats for (?P<path>.*):$")
# memory.stat's names (memcg1_stat_names[], memory_stats[], vm_event_name()) are lower case.
_STAT = re.compile(r"^(?P<key>[a-z0-9_]{1,64}) (?P<value>\d{1,20})$")
_STATS_END = "Tasks state"
MAX_STAT_KEYS = 128  # v1 prints 42 here, v2 ~60: the bound only keeps a stray run of lines from growing it


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
    # The kernel's account of the OOM cgroup at the kill (memcg OOMs only), bytes unless said:
    memcg_usage: int | None = None  # "memory: usage"
    memcg_limit: int | None = None  # "memory: limit" (v1 limit_in_bytes, v2 memory.max)
    memcg_failcnt: int | None = None  # times the limit was hit ("memory: failcnt")
    memcg_swap_usage: int | None = None  # v2 "swap: usage"; v1 prints memory+swap instead
    memcg_memsw_usage: int | None = None  # v1 "memory+swap: usage": memory and swap together
    kmem_usage: int | None = None  # v1 "kmem: usage"
    memcg_stat_path: str | None = None  # the cgroup named on "Memory cgroup stats for PATH:"
    memcg_stat: dict[str, int] = {}  # its memory.stat as printed: sizes in bytes, events in counts

    @property
    def cgroup_oom(self) -> bool:
        return self.constraint == "CONSTRAINT_MEMCG"


# memory.stat has ~60 lines; a record of more (no kernel prints one) is cut there
MAX_LINES_PER_RECORD = 256
# a printk record holds at most ~1 KiB of text (LOG_LINE_MAX 1024 less its prefix): one this long was cut
_RECORD_CAP = 960


class _Report:
    """What one OOM report has said so far, from its "invoked oom-killer" line to its kill."""

    def __init__(self, trigger_comm: str | None = None):
        self.trigger_comm = trigger_comm
        self.trigger_pid: int | None = None
        self.summary: dict[str, str] = {}
        self.memcg: dict[str, int] = {}  # OomKill's memcg_* and kmem_* fields
        self.stat_path: str | None = None
        self.stat: dict[str, int] = {}
        self.in_stats = False

    def take(self, message: str) -> None:
        """Read one record of the report (the memcg lines only once it is open: a kill's account
        is never taken from lines outside its own report)."""
        if (m := _CPU_LINE.match(message)) and self.trigger_comm is not None and self.trigger_pid is None:
            self.trigger_pid = int(m["pid"])
        elif m := _SUMMARY.match(message):
            self.summary = dict(f.split("=", 1) for f in m["fields"].split(",") if "=" in f)
            self.in_stats = False
        elif self.trigger_comm is None:
            return
        elif self.in_stats and (m := _STAT.match(message)):
            if len(self.stat) < MAX_STAT_KEYS:
                self.stat.setdefault(m["key"], int(m["value"]))
        elif message.startswith(_STATS_END):
            self.in_stats = False
        elif (m := _STATS_FOR.match(message)) and self.stat_path is None:
            self.stat_path, self.in_stats = m["path"], True
        elif m := _COUNTER.match(message):
            self._counter(m)

    def lines_of(self, message: str) -> list[str]:
        """A record's lines: one printk of many lines is one record, its newlines escaped (/dev/kmsg
        writes \\x0a), as a kernel before 6.4 prints an OOM cgroup's memory.stat. Split only there: a
        comm may hold \\x0a too (PR_SET_NAME), and the victim's and the trigger's lines are matched
        whole. The last line of a record cut at its cap may be a truncated number: dropped."""
        if "\\x0a" not in message or not (self.in_stats or message.startswith("Memory cgroup stats for")):
            return [message]
        lines = message.split("\\x0a")
        if len(lines) > MAX_LINES_PER_RECORD:
            lines = lines[:MAX_LINES_PER_RECORD]
        elif len(message) >= _RECORD_CAP and not message.endswith("\\x0a"):
            lines = lines[:-1]
        return lines

    def _counter(self, m: re.Match) -> None:
        usage = int(m["usage"]) * 1024
        if m["name"] == "memory":
            self.memcg |= {"memcg_usage": usage, "memcg_limit": int(m["limit"]) * 1024}
            self.memcg["memcg_failcnt"] = int(m["failcnt"])
        else:
            field = {"swap": "memcg_swap_usage", "memory+swap": "memcg_memsw_usage", "kmem": "kmem_usage"}
            self.memcg[field[m["name"]]] = usage

    def kill(self, when: float | None, m: re.Match) -> OomKill:
        """The OomKill of this report, ended by its "Killed process" line `m`."""
        sizes = {s["key"]: int(s["kib"]) * 1024 for s in _SIZE.finditer(m["rest"])}
        constraint = self.summary.get("constraint")
        if constraint is None:
            constraint = "CONSTRAINT_MEMCG" if m["kind"].startswith("Memory cgroup") else None
        return OomKill(
            when=when,
            victim_pid=int(m["pid"]),
            victim_comm=m["comm"],
            constraint=constraint,
            oom_memcg=self.summary.get("oom_memcg"),
            task_memcg=self.summary.get("task_memcg"),
            trigger_comm=self.trigger_comm,
            trigger_pid=self.trigger_pid,
            anon_rss=sizes.get("anon-rss"),
            file_rss=sizes.get("file-rss"),
            shmem_rss=sizes.get("shmem-rss"),
            total_vm=sizes.get("total-vm"),
            memcg_stat_path=self.stat_path,
            memcg_stat=self.stat,
            **self.memcg,
        )


def parse_kmsg_records(records: list[tuple[float | None, str]]) -> list[OomKill]:
    """OOM kills from (timestamp, message) records in log order. Linear in the records; each kill
    keeps at most MAX_STAT_KEYS memory.stat lines."""
    kills = []
    report = _Report()
    for when, message in records:
        if m := _INVOKED.match(message):
            report = _Report(m["comm"])
        elif m := _KILLED.match(message):
            kills.append(report.kill(when, m))
            report = _Report()
        else:
            for line in report.lines_of(message):
                report.take(line)
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
