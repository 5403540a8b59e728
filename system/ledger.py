"""Ledgers: a total broken into the parts the kernel says it is made of, with what the parts do not
explain shown as a part of its own (the residual), never absorbed into another.

Three totals, each from the kernel's own counters:
- a process's RSS (/proc/PID/status): anonymous + file-backed + shared memory (tmpfs, memfd, System V,
  shared anonymous), the anonymous part split by mapping where /proc/PID/smaps was read; beside it,
  what the process holds in the kernel and RSS does not count: its page tables (VmPTE), its threads'
  kernel stacks (an estimate: threads x the kernel's stack size), its descriptors by type;
- a memory cgroup's usage: anon + shmem + page cache (active, inactive, other) + kernel memory (v2:
  slab, stacks, page tables, percpu, vmalloc, other; v1: one figure, memory.kmem, unsplit) + socket
  buffers (v2) + zswap (v2); beside it the working set (usage minus inactive page cache, what
  Kubernetes and cAdvisor call the working set: what reclaim cannot easily take back);
- the host's MemTotal: anon + page cache + shmem + swap cache + slab + kernel stacks + page tables +
  vmalloc + percpu + huge pages + zswap + free.
A line the source cannot give is None (unknown, not zero) and is named in `unknown`; the residual is
then the total less the lines that are known, and says so.

A process's anonymous memory is also split by who holds it (AnonSplit): parts its readers give (a
runtime's own figures, the native allocator's bookkeeping: their AnonPart each) and the residual,
anonymous memory no reader attributes, all against the RssAnon read with them; a reader that did
not say is named, never a zero."""

from __future__ import annotations

from typing import Literal

from ._parse import Fact
from .cgroup import CgroupMemory
from .kmsg import OomKill
from .meminfo import MemInfo
from .process import ProcessMemory

Scope = Literal["process", "cgroup", "host"]

# x86_64 and arm64 THREAD_SIZE: 16 KiB a thread (4 pages); an estimate, the kernel has no per-process figure
KERNEL_STACK_BYTES = 16 << 10

RESIDUAL = "residual"


class Line(Fact):
    key: str  # the fact name's last part: ledger.<scope>.<key>
    label: str  # as the report reads it
    bytes: int | None = None  # None: the source does not say
    estimate: bool = False
    parts: list[tuple[str, int]] = []  # its detail, largest first (by file, cache, mount, mapping)


class Ledger(Fact):
    scope: Scope
    total_label: str
    total: int | None = None
    lines: list[Line] = []  # the parts of the total, the residual last
    beside: list[Line] = []  # figures read with it and not part of the sum
    counts: dict[str, int] = {}  # descriptors by type (a process)
    unknown: list[str] = []  # the keys of lines the source does not give

    def line(self, key: str) -> Line | None:
        return next((x for x in [*self.lines, *self.beside] if x.key == key), None)

    def value(self, key: str) -> int | None:
        line = self.line(key)
        return line.bytes if line is not None else None

    @property
    def residual(self) -> int | None:
        return self.value(RESIDUAL)


# Every line a ledger can have, by scope: (key, label, in the sum or beside it). The one home of
# their names: the fact catalog and the report read this table.
LINES: dict[Scope, list[tuple[str, str, bool]]] = {
    "process": [
        ("anon", "anonymous memory", True),
        ("file", "file-backed (mapped files)", True),
        ("shmem", "shared memory (tmpfs, memfd, System V, shared anonymous)", True),
        (RESIDUAL, "residual (RSS not in the lines above)", True),
        ("page_tables", "page tables (kernel memory, not in RSS)", False),
        ("kernel_stacks", "kernel stacks of its threads (estimate: threads x 16 KiB)", False),
        ("socket_buffers", "socket buffers of its sockets (the kernel's socket diagnostics)", False),
        ("memfds", "memfds it holds open, mapped or not (shared memory)", False),
    ],
    "cgroup": [
        ("anon", "anonymous memory", True),
        ("shmem", "shared memory (tmpfs, shm)", True),
        ("file_active", "page cache, active", True),
        ("file_inactive", "page cache, inactive (reclaimed first)", True),
        ("file_other", "page cache, other (unevictable, not on a list)", True),
        ("slab_reclaimable", "kernel: slab, reclaimable (dentries, inodes)", True),
        ("slab_unreclaimable", "kernel: slab, unreclaimable", True),
        ("kernel_stack", "kernel: stacks", True),
        ("page_tables", "kernel: page tables", True),
        ("percpu", "kernel: per-CPU", True),
        ("vmalloc", "kernel: vmalloc", True),
        ("kernel_other", "kernel: other", True),
        ("kernel", "kernel memory (v1: not split)", True),
        ("sock", "socket buffers", True),
        ("zswap", "zswap (compressed swap in memory)", True),
        (RESIDUAL, "residual (usage not in the lines above)", True),
        ("working_set", "working set (usage minus inactive page cache)", False),
        ("tcp", "TCP socket buffers (v1: charged on a counter of their own)", False),
    ],
    "host": [
        ("anon", "anonymous memory of processes", True),
        ("file_active", "page cache, active", True),
        ("file_inactive", "page cache, inactive (reclaimed first)", True),
        ("file_other", "page cache, other (buffers, unevictable)", True),
        ("shmem", "shared memory (tmpfs, shm)", True),
        ("swap_cache", "swap cache (a page swapped in and still mapped is in anon too)", True),
        ("slab_reclaimable", "kernel: slab, reclaimable (dentries, inodes)", True),
        ("slab_unreclaimable", "kernel: slab, unreclaimable", True),
        ("kernel_stack", "kernel: stacks", True),
        ("page_tables", "kernel: page tables", True),
        ("vmalloc", "kernel: vmalloc (less the kernel stacks it maps)", True),
        ("percpu", "kernel: per-CPU", True),
        ("hugetlb", "huge pages (hugetlbfs pool)", True),
        ("zswap", "zswap (compressed swap in memory)", True),
        ("free", "free", True),
        (RESIDUAL, "residual (kernel memory no counter names: drivers, network pages)", True),
    ],
}

TOTAL_LABELS: dict[Scope, str] = {"process": "RSS", "cgroup": "usage", "host": "MemTotal"}


def _build(
    scope: Scope,
    total: int | None,
    values: dict[str, int | None],
    parts: dict[str, list[tuple[str, int]]] | None = None,
    estimates: frozenset[str] = frozenset(),
    counts: dict[str, int] | None = None,
) -> Ledger:
    """The ledger of `total` from the values its lines have (a key absent from values is not a line of
    this source; present and None is a line the source cannot give), the residual computed."""
    parts = parts or {}
    lines, beside, unknown = [], [], []
    known = 0
    for key, label, summed in LINES[scope]:
        if key == RESIDUAL or key not in values:
            continue
        value = values[key]
        line = Line(key=key, label=label, bytes=value, estimate=key in estimates, parts=parts.get(key, []))
        (lines if summed else beside).append(line)
        if value is None:
            unknown.append(key)
        elif summed:
            known += value
    label = next(lab for k, lab, _s in LINES[scope] if k == RESIDUAL)
    lines.append(Line(key=RESIDUAL, label=label, bytes=(total - known) if total is not None else None))
    return Ledger(
        scope=scope,
        total_label=TOTAL_LABELS[scope],
        total=total,
        lines=lines,
        beside=beside,
        counts=counts or {},
        unknown=unknown,
    )


def _minus(a: int | None, *bs: int | None) -> int | None:
    if a is None or any(b is None for b in bs):
        return None
    return max(0, a - sum(b for b in bs if b is not None))


def _plus(*xs: int | None) -> int | None:
    return None if any(x is None for x in xs) else sum(x for x in xs if x is not None)


def host_ledger(m: MemInfo, parts: dict[str, list[tuple[str, int]]] | None = None, vmap_stacks: bool = True) -> Ledger:
    """MemTotal, from /proc/meminfo. Cached counts shared memory (Shmem) too, and Active(file) and
    Inactive(file) count Buffers: page cache is split so that each page is in one line."""
    cache = _plus(m.buffers, m.cached)
    file_other = _minus(cache, m.shmem, m.active_file, m.inactive_file)
    values: dict[str, int | None] = {
        "anon": m.anon_pages,
        "file_active": m.active_file,
        "file_inactive": m.inactive_file,
        "file_other": file_other,
        "shmem": m.shmem,
        "swap_cache": m.swap_cached,
        "slab_reclaimable": m.sreclaimable,
        "slab_unreclaimable": m.sunreclaim,
        "kernel_stack": m.kernel_stack,
        "page_tables": _plus(m.page_tables, m.sec_page_tables or 0) if m.page_tables is not None else None,
        # VmallocUsed counts the threads' stacks where they are vmap'd (CONFIG_VMAP_STACK, the default
        # on x86-64 and arm64), which KernelStack counts too: each page in one line
        "vmalloc": _minus(m.vmalloc_used, m.kernel_stack)
        if vmap_stacks and m.vmalloc_used is not None
        else m.vmalloc_used,
        "percpu": m.percpu,
        "hugetlb": m.hugetlb,
        "free": m.mem_free,
    }
    if m.zswap is not None:
        values["zswap"] = m.zswap
    return _build("host", m.mem_total, values, parts)


def _v2_values(stat: dict[str, int]) -> dict[str, int | None]:
    """v2's memory.stat: anon excludes shared memory, file includes it (its pages sit on the anon
    LRU lists, so active_file and inactive_file do not), kernel includes slab, stacks, page tables,
    percpu and vmalloc (5.18+; before it, its known parts are summed and `other` is unknown)."""
    g = stat.get
    slab_r, slab_u = g("slab_reclaimable"), g("slab_unreclaimable")
    named = [slab_r, slab_u, g("kernel_stack"), g("pagetables"), g("percpu"), g("vmalloc")]
    kernel = g("kernel")
    values: dict[str, int | None] = {
        "anon": g("anon"),
        "shmem": g("shmem"),
        "file_active": g("active_file"),
        "file_inactive": g("inactive_file"),
        "file_other": _minus(g("file"), g("shmem"), g("active_file"), g("inactive_file")),
        "slab_reclaimable": slab_r,
        "slab_unreclaimable": slab_u,
        "kernel_stack": g("kernel_stack"),
        "page_tables": _plus(g("pagetables"), g("sec_pagetables") or 0) if "pagetables" in stat else None,
        "percpu": g("percpu"),
        "vmalloc": g("vmalloc"),
        # zswap's compressed pages are charged as kernel memory (obj_cgroup_charge_zswap): they are
        # its own line, so not in `other` as well
        "kernel_other": _minus(kernel, *[x or 0 for x in named], g("zswap") or 0) if kernel is not None else None,
        "sock": g("sock"),
    }
    if "zswap" in stat:
        values["zswap"] = g("zswap")
    return values


def _v1_values(stat: dict[str, int], kmem: int | None, kmem_tcp: int | None) -> dict[str, int | None]:
    """v1's memory.stat (hierarchical total_* where the kernel gives them): rss is anonymous memory,
    cache is page cache with shared memory in it; kernel memory is memory.kmem, which v1's usage
    counts and its memory.stat does not split."""

    def g(name: str) -> int | None:
        return stat.get(f"total_{name}", stat.get(name))

    return {
        "anon": g("rss"),
        "shmem": g("shmem"),
        "file_active": g("active_file"),
        "file_inactive": g("inactive_file"),
        "file_other": _minus(g("cache"), g("shmem"), g("active_file"), g("inactive_file")),
        "kernel": kmem,
        "tcp": kmem_tcp,
    }


def cgroup_ledger(cg: CgroupMemory) -> Ledger:
    """The cgroup's usage (memory.current, v1 usage_in_bytes) by kind, from its memory.stat."""
    values = _v2_values(cg.stat) if cg.version == 2 else _v1_values(cg.stat, cg.kmem_usage, cg.kmem_tcp_usage)
    inactive = values.get("file_inactive")
    values["working_set"] = _minus(cg.usage, inactive) if cg.usage is not None and inactive is not None else None
    return _build("cgroup", cg.usage, values)


# The cgroup ledger's lines in the four parts serve's flight recorder keeps a series of each
# (diagnose/serve/recorder.py): what an OOM kill's scene is told in
FAMILIES = ("anon", "file", "shmem", "kernel")


_CGROUP_SUMMED = frozenset(k for k, _label, in_sum in LINES["cgroup"] if in_sum and k != RESIDUAL)


def cgroup_families(version: int, stat: dict[str, int], kmem: int | None = None) -> dict[str, int | None]:
    """The cgroup ledger's summed lines (the same values cgroup_ledger makes its lines of, without
    its models: the recorder reads hundreds of cgroups a round) as anon, file (page cache, less
    shmem), shmem and kernel (every kernel line, socket buffers and zswap); the residual stays out."""
    values = _v2_values(stat) if version == 2 else _v1_values(stat, kmem, None)
    out: dict[str, int | None] = {"anon": None, "file": None, "shmem": None, "kernel": None}
    for key, value in values.items():
        if key not in _CGROUP_SUMMED or value is None:
            continue
        family = key if key in ("anon", "shmem") else "file" if key.startswith("file_") else "kernel"
        out[family] = (out[family] or 0) + value
    return out


def oom_cgroup_ledger(kill: OomKill) -> Ledger | None:
    """The cgroup's usage at a memcg OOM kill, from the kernel's own report of it (the `memory:`
    line and memory.stat as printed, system/kmsg.py); None where the log holds no such report."""
    stat = kill.memcg_stat
    if not stat or kill.memcg_usage is None:
        return None
    version: Literal[1, 2] = 2 if "anon" in stat and "file" in stat else 1
    path = kill.memcg_stat_path or kill.oom_memcg or "/"
    cg = CgroupMemory(
        version=version,
        path=path,
        fs_path="",
        usage=kill.memcg_usage,
        limit=kill.memcg_limit,
        stat=stat,
        kmem_usage=kill.kmem_usage,
    )
    return cgroup_ledger(cg)


def process_ledger(
    p: ProcessMemory,
    fds: dict[str, int] | None = None,
    parts: dict[str, list[tuple[str, int]]] | None = None,
) -> Ledger:
    """The process's RSS from /proc/PID/status (RssAnon, RssFile, RssShmem), the kernel memory it
    holds beside it, and its descriptors by type (system/fds.py) where they were read."""
    values: dict[str, int | None] = {
        "anon": p.rss_anon,
        "file": p.rss_file,
        "shmem": p.rss_shmem,
        "page_tables": p.vm_pte,
        "kernel_stacks": p.threads * KERNEL_STACK_BYTES if p.threads is not None else None,
    }
    return _build("process", p.rss, values, parts, frozenset({"kernel_stacks"}), fds)


class AnonPart(Fact):
    """One holder of a process's anonymous memory: a runtime's heap, the allocator's free chunks."""

    key: str  # what a fact calls it: allocator_in_use, allocator_free, allocator_top, runtime_*
    label: str  # as the report reads it
    bytes: int
    estimate: bool = False
    source: str = ""  # who said it: "glibc malloc's arenas", "the JVM's own counters"


class AnonSplit(Fact):
    """A process's anonymous memory (RssAnon) at one reading, split by who holds it: the parts the
    readers that apply said, and the residual, anonymous memory no reader attributes. The parts and
    the total were read together (at_s, seconds into the window), so that they add up; a reader that
    did not apply or failed gives no part and is named in `unread`, never a zero."""

    total: int | None  # RssAnon read with the parts
    at_s: float | None = None  # seconds from the window's first sample
    parts: list[AnonPart] = []
    residual: int | None = None  # total less the parts (negative: the estimates overcount)
    unread: list[str] = []  # sources that did not say, and why: "glibc malloc: main_arena not found"
    moved: int | None = None  # how much RssAnon changed while the parts were read (read again after)

    def value(self, key: str) -> int | None:
        return next((p.bytes for p in self.parts if p.key == key), None)


ANON_RESIDUAL_LABEL = "anonymous memory no reader attributes"


def anon_split(
    total: int | None,
    parts: list[AnonPart],
    unread: list[str],
    at_s: float | None = None,
    after: int | None = None,
) -> AnonSplit:
    """The split of `total`, its residual computed: total less the parts (None where total is);
    after: RssAnon read again once the parts were."""
    known = sum(p.bytes for p in parts)
    residual = total - known if total is not None else None
    moved = after - total if after is not None and total is not None else None
    return AnonSplit(total=total, at_s=at_s, parts=parts, residual=residual, unread=unread, moved=moved)


def ledger_fact_defs() -> list[tuple[str, str, str]]:
    """(name, kind, meaning) of every fact ledger_facts may give: the catalog's entries for them."""
    out = []
    for scope, lines in LINES.items():
        s = f"ledger.{scope}"
        total = TOTAL_LABELS[scope]
        out += [
            (f"{s}.total", "bytes", f"the {scope}'s {total} at the window's end"),
            (f"{s}.total_growth", "bytes", f"change of the {scope}'s {total} over the window"),
            (f"{s}.accounts", "string", f"the lines of the {scope}'s {total} that moved, with shares and residual"),
            (f"{s}.top_line", "string", f"the line of the {scope}'s {total} that grew most (its label)"),
            (f"{s}.top_line_key", "string", f"the key of that line ({', '.join(k for k, _l, _s in lines)})"),
            (f"{s}.top_line_growth", "bytes", "how much that line grew over the window"),
            (f"{s}.top_line_shape", "string", "that line's series: climbing, levelled, flat, ..."),
            (f"{s}.top_line_share", "percent", f"that line's growth as a share of the {total}'s growth"),
            (f"{s}.largest_line_key", "string", f"the key of the line holding most of the {total} (free aside)"),
        ]
        for key, label, _summed in lines:
            out += [
                (f"{s}.{key}", "bytes", f"{scope} ledger: {label}, at the window's end"),
                (f"{s}.{key}_growth", "bytes", f"{scope} ledger: change of {label} over the window"),
                (f"{s}.{key}_shape", "string", f"{scope} ledger: {label}, its series' shape"),
            ]
    out += [
        ("ledger.cgroup.working_set_percent", "percent", "the cgroup's working set as a share of its usage"),
        ("ledger.process.fds", "number", "descriptors the process holds at the window's end"),
        ("sockets.count", "number", "the process's sockets the kernel's socket diagnostics found at the window's end"),
        ("sockets.peer_gone", "number", "of them, sockets whose peer has closed while the process keeps them open"),
        ("ledger.process.page_tables_per_rss_growth", "percent", "its page tables' growth as a share of its RSS's"),
        ("ledger.process.fds_growth", "number", "change of its descriptor count over the window"),
        ("ledger.process.fds_shape", "string", "its descriptor count over the window: climbing, levelled, flat ..."),
        ("ledger.process.fds_top_type", "string", "the descriptor type whose count grew most (socket, pipe, ...)"),
        ("ledger.process.fds_top_type_count", "number", "descriptors of that type at the window's end"),
        ("ledger.process.fds_top_type_growth", "number", "change of that type's count over the window"),
        ("ledger.process.anon_allocator_free", "bytes", "free chunks the native allocator holds (estimate, end)"),
        (
            "ledger.process.anon_allocator_free_share",
            "percent",
            "those free chunks as a share of the anonymous memory read with them",
        ),
        ("ledger.process.anon_allocator_in_use", "bytes", "blocks the native allocator has handed out (estimate, end)"),
        ("ledger.process.anon_runtime", "bytes", "anonymous memory the runtime's own figures account for (end)"),
        ("ledger.process.anon_unattributed", "bytes", "anonymous memory no reader attributes (the split's residual)"),
        (
            "ledger.process.anon_unattributed_share",
            "percent",
            "that residual as a share of the anonymous memory read with the split",
        ),
        ("shm.top_mount", "string", "the tmpfs mount whose use grew most over the window"),
        ("shm.top_mount_used", "bytes", "what that mount holds at the window's end"),
        ("shm.top_mount_growth", "bytes", "change of that mount's use over the window"),
        (
            "shm.top_mount_share",
            "percent",
            "that change as a share of the host's Shmem growth (None: Shmem did not grow)",
        ),
        ("shm.top_pattern", "string", "its file pattern that grew most (digits as *): /dev/shm/job-*.spool"),
        ("shm.top_pattern_files", "number", "files of that pattern at the window's end"),
        ("shm.top_pattern_files_growth", "number", "change of that pattern's file count over the window"),
        ("shm.top_pattern_bytes", "bytes", "memory those files hold at the window's end"),
        ("shm.top_pattern_growth", "bytes", "change of that memory over the window"),
        ("sysv.new_segments", "number", "System V segments the target's processes created in the window, still there"),
        ("sysv.new_bytes", "bytes", "the memory they hold (resident; their size where the kernel prints no rss)"),
        (
            "sysv.unread_processes",
            "number",
            "the target's processes in an IPC namespace not memdiag's: their segments are not read",
        ),
        ("sysv.segments", "number", "System V segments on the host (memdiag's IPC namespace) at the window's end"),
        ("sysv.top_creator", "string", "the pid (shm_cpid) that created most of those new segments"),
        ("sysv.top_creator_segments", "number", "how many of them it created"),
        ("sysv.top_creator_bytes", "bytes", "the memory they hold: resident, or their size (sysv.top_creator_held)"),
        ("sysv.top_creator_held", "string", "what that figure is: resident, or in size (no rss column)"),
        ("sysv.top_creator_early", "number", "of them, created in the window's first half (by their ctime)"),
        ("sysv.top_creator_late", "number", "of them, created in its second half"),
        ("sysv.top_creator_unattached", "number", "of them, segments no process attaches (nattch 0)"),
        ("sysv.top_key", "string", "the key of its largest new segment (0x...; IPC_PRIVATE)"),
        ("sysv.top_size", "bytes", "that segment's size"),
        ("sysv.top_shmid", "string", "that segment's shmid, as ipcs and ipcrm take it"),
    ]
    return out
