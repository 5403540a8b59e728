"""The window's ledgers: the target's memory (a process's RSS, its cgroup's usage, the host's MemTotal)
broken into its lines at every sample (system/ledger.py), with the residual as a line of its own;
the tmpfs mounts and their files; and the facts rules read of them (ledger.*, shm.*, slab.*): which
line grew, by how much, and what share of the total's growth it is."""

from __future__ import annotations

from memdiag.system import ledger as L
from memdiag.system.slab import SlabCache
from memdiag.system.sysvshm import ShmSegment, resident
from memdiag.system.tmpfs import ShmMount
from memdiag.system.trends import growth_trend
from memdiag.system.units import fmt_bytes

from .observe import Observation
from .report import LedgerReport, LedgerRow, ShmFiles
from .snapshot import Snapshot

TOP_PARTS = 5  # the detail a line shows: its largest parts (slab caches, mounts)


def _of(snap: Snapshot, scope: L.Scope) -> L.Ledger | None:
    if scope == "process":
        return L.process_ledger(snap.process, snap.fds) if snap.process is not None else None
    if scope == "cgroup":
        return L.cgroup_ledger(snap.cgroup) if snap.cgroup is not None else None
    return L.host_ledger(snap.meminfo)


def _subject(obs: Observation, scope: L.Scope) -> str:
    if scope == "process":
        last = obs.snapshots[-1].process
        return f"PID {obs.target.pid} ({last.comm})" if last is not None else f"PID {obs.target.pid}"
    if scope == "cgroup":
        cg = obs.snapshots[-1].cgroup
        return f"cgroup {cg.path}" if cg is not None else "cgroup"
    return "the host"


def _ledger(obs: Observation, scope: L.Scope, parts: dict[str, list[tuple[str, int]]]) -> LedgerReport | None:
    """One scope's ledger over the window's samples (those that read it)."""
    t0 = obs.snapshots[0].t
    read = [(s.t - t0, led) for s in obs.snapshots if (led := _of(s, scope)) is not None]
    if not read:
        return None
    first, last = read[0][1], read[-1][1]
    rows, summed = [], {x.key for x in last.lines}
    for line in [*last.lines, *last.beside]:
        points = [(t, v) for t, led in read if (v := led.value(line.key)) is not None]
        rows.append(
            LedgerRow(
                key=line.key,
                label=line.label,
                summed=line.key in summed,
                first=first.value(line.key),
                last=line.bytes,
                series=[int(v) for _t, v in points],
                shape=growth_trend(points).shape if len(points) >= 3 else "unknown",
                estimate=line.estimate,
                parts=parts.get(line.key, []),
            )
        )
    if scope == "process" and obs.sockets_last is not None:  # read at the window's ends only: a dump is host-wide
        a, b = obs.sockets_first, obs.sockets_last
        label = next(lab for k, lab, _s in L.LINES["process"] if k == "socket_buffers")
        rows.append(
            LedgerRow(key="socket_buffers", label=label, summed=False, first=a.buffers if a else None, last=b.buffers)
        )
    if scope == "process" and obs.memfds_last is not None:  # read at the window's end: what they hold now
        label = next(lab for k, lab, _s in L.LINES["process"] if k == "memfds")
        held = sum(n for _name, n in obs.memfds_last)
        rows.append(LedgerRow(key="memfds", label=label, summed=False, last=held, parts=parts.get("memfds", [])))
    detail_at, totals, split = None, {}, None
    if scope == "process" and obs.closing is not None:  # the detail's own moment and totals
        c = obs.closing
        detail_at = c.t - t0
        at_end = L.process_ledger(c.process)
        totals = {"total": at_end.total, **{x.key: x.bytes for x in at_end.lines if x.key != L.RESIDUAL}}
        split = L.anon_split(c.process.rss_anon, c.anon_parts, c.anon_unread, detail_at, c.anon_after)
    return LedgerReport(
        scope=scope,
        subject=_subject(obs, scope),
        total_label=last.total_label,
        total_first=first.total,
        total_last=last.total,
        rows=rows,
        counts_first=first.counts,
        counts_last=last.counts,
        unknown=last.unknown,
        detail_at_s=detail_at,
        detail_totals=totals,
        anon_split=split,
    )


def slab_parts(first: list[SlabCache] | None, last: list[SlabCache] | None) -> dict[str, list[tuple[str, int]]]:
    """The slab caches, largest growth first, as the detail of the host's slab lines: a cache is
    under the reclaimable line where the kernel says it is (SLAB_RECLAIM_ACCOUNT), else under the
    unreclaimable one."""
    if not last:
        return {}
    before = {c.name: c.size_bytes for c in first or []}
    grown = sorted(last, key=lambda c: (c.size_bytes - before.get(c.name, 0), c.size_bytes), reverse=True)
    out: dict[str, list[tuple[str, int]]] = {"slab_reclaimable": [], "slab_unreclaimable": []}
    for c in grown:
        line = out["slab_reclaimable" if c.reclaimable else "slab_unreclaimable"]
        if len(line) < TOP_PARTS:
            line.append((f"{c.name} ({fmt_signed(c.size_bytes - before.get(c.name, 0))})", c.size_bytes))
    return out


def _members(obs: Observation) -> dict[str, list[tuple[str, int]]]:
    """Which of the cgroup's processes hold its anonymous and shared memory (their RssAnon and
    RssShmem at the end): who owns which part of its usage, the largest first."""
    cg = obs.last_cgroup
    if cg is None:
        return {}
    members = [p for pid in cg.procs if (p := obs.processes_last.get(pid)) is not None]

    def top(field: str) -> list[tuple[str, int]]:
        held = [(f"PID {p.pid} ({p.comm})", getattr(p, field)) for p in members if getattr(p, field)]
        return sorted(held, key=lambda x: -x[1])[:TOP_PARTS]

    return {"anon": top("rss_anon"), "shmem": top("rss_shmem")}


def _segment(g: ShmSegment) -> str:
    return f"System V shmid {g.shmid} (key {g.key:#x}, created by PID {g.cpid}, {g.nattch} attached)"


def build_ledgers(obs: Observation) -> list[LedgerReport]:
    """The target's ledgers: the process's (a pid target), its cgroup's, the host's; in that order."""
    if not obs.snapshots:
        return []
    host_parts = slab_parts(obs.slab_first, obs.slab_last)
    shmem = [(m.mount_point, m.used) for m in obs.shm_last or [] if m.used]
    shmem += [(_segment(g), g.rss) for g in obs.sysv_last or [] if g.rss]
    host_parts["shmem"] = sorted(shmem, key=lambda x: -x[1])[:TOP_PARTS]
    process_parts = dict(obs.smaps_last or {})
    if obs.memfds_last:
        process_parts["memfds"] = obs.memfds_last[:TOP_PARTS]
    out = []
    for scope, parts in (("process", process_parts), ("cgroup", _members(obs)), ("host", host_parts)):
        led = _ledger(obs, scope, parts)  # type: ignore[arg-type]
        if led is not None:
            out.append(led)
    return out


def build_shm(obs: Observation) -> list[ShmFiles]:
    """Each tmpfs mount holding memory at the end, with its file patterns' counts and bytes at both ends."""
    before: dict[str, ShmMount] = {m.mount_point: m for m in obs.shm_first or []}
    out = []
    for m in obs.shm_last or []:
        if not m.used:
            continue
        b = before.get(m.mount_point)
        was = {p.pattern: p for p in b.patterns} if b is not None else {}
        pats = []
        for p in m.patterns:
            w = was.get(p.pattern)
            pats.append((p.pattern, w.files if w else 0, p.files, w.bytes if w else 0, p.bytes))
        out.append(
            ShmFiles(
                mount_point=m.mount_point,
                used_first=b.used if b is not None else None,
                used_last=m.used,
                size=m.size,
                patterns=pats,
                files_last=m.files,
                partial=m.partial,
            )
        )
    return out


def _share(part: int | None, whole: int | None) -> float | None:
    return 100.0 * part / whole if part is not None and whole else None


def shares_meaningful(led: LedgerReport) -> bool:
    """A line's share of the total's change means something when the total grew by at least half of
    what its lines moved in all: a total that barely moved while its lines traded places has none."""
    total = led.total_growth
    churn = sum(abs(r.growth or 0) for r in led.rows if r.summed)
    return bool(total and total > 0 and 2 * total >= churn)


def growth_text(led: LedgerReport) -> str:
    """The lines that moved over the window, largest first, each with its share of the total's change
    (where shares mean something), the residual always named: how the report's verdicts account for
    the memory they are about."""
    total, shares = led.total_growth, shares_meaningful(led)
    moved = [r for r in led.rows if r.summed and r.growth]
    moved.sort(key=lambda r: -abs(r.growth or 0))
    words = []
    for r in moved[:4]:
        share = _share(r.growth, total) if shares else None
        words.append(f"{r.label} {fmt_signed(r.growth)}" + (f" ({share:.0f}%)" if share is not None else ""))
    res = led.row(L.RESIDUAL)
    if res is not None and res not in moved[:4]:
        words.append(f"{res.label} {fmt_signed(res.growth)}" if res.growth is not None else f"{res.label} unknown")
    if led.unknown:
        words.append("not said by this kernel: " + ", ".join(led.unknown))
    head = f"{led.total_label} of {led.subject} {fmt_signed(total)} over the window" if total is not None else ""
    return head + (": " if head and words else "") + "; ".join(words)


def fmt_signed(n: int | None) -> str:
    if n is None:
        return "unknown"
    return ("+" if n > 0 else "-" if n < 0 else "") + fmt_bytes(abs(n))


def _scope_facts(led: LedgerReport) -> dict:
    s = f"ledger.{led.scope}"
    f: dict = {f"{s}.total": led.total_last, f"{s}.total_growth": led.total_growth, f"{s}.accounts": growth_text(led)}
    for r in led.rows:
        f[f"{s}.{r.key}"] = r.last
        f[f"{s}.{r.key}_growth"] = r.growth
        f[f"{s}.{r.key}_shape"] = r.shape
    grew = [r for r in led.rows if r.summed and r.growth is not None and r.growth > 0]
    if grew:
        top = max(grew, key=lambda r: r.growth or 0)
        f[f"{s}.top_line"] = top.label
        f[f"{s}.top_line_key"] = top.key
        f[f"{s}.top_line_growth"] = top.growth
        f[f"{s}.top_line_shape"] = top.shape
        f[f"{s}.top_line_share"] = _share(top.growth, led.total_growth) if shares_meaningful(led) else None
    held = [r for r in led.rows if r.summed and r.key not in (L.RESIDUAL, "free") and r.last]
    if held:
        f[f"{s}.largest_line_key"] = max(held, key=lambda r: r.last or 0).key
    ws = led.row("working_set")
    if ws is not None and ws.last is not None and led.total_last:
        f[f"{s}.working_set_percent"] = _share(ws.last, led.total_last)
    return f


def _fd_facts(led: LedgerReport, obs: Observation) -> dict:
    """A process's descriptors: how many, of which type, and whether their count only climbs."""
    a, b = led.counts_first, led.counts_last
    f: dict = {"ledger.process.fds": b.get("total"), "ledger.process.fds_growth": None}
    if "total" in a and "total" in b:
        f["ledger.process.fds_growth"] = b["total"] - a["total"]
    t0 = obs.snapshots[0].t
    points = [(s.t - t0, float(s.fds["total"])) for s in obs.snapshots if s.fds and "total" in s.fds]
    # a count, not bytes: one descriptor more is a change (the bytes' floor is 256 KiB of noise)
    f["ledger.process.fds_shape"] = growth_trend(points, floor=1).shape if len(points) >= 3 else "unknown"
    kinds = [k for k in b if k not in ("total", "more")]
    if kinds:
        top = max(kinds, key=lambda k: (b[k] - a.get(k, 0), b[k]))
        f["ledger.process.fds_top_type"] = top
        f["ledger.process.fds_top_type_count"] = b[top]
        f["ledger.process.fds_top_type_growth"] = b[top] - a.get(top, 0)
    return f


def _shm_facts(shm: list[ShmFiles], host: LedgerReport | None) -> dict:
    grown = [m for m in shm if m.used_first is not None]
    if not grown:
        return {}
    m = max(grown, key=lambda m: m.used_last - (m.used_first or 0))
    f: dict = {"shm.top_mount": m.mount_point, "shm.top_mount_used": m.used_last}
    f["shm.top_mount_growth"] = growth = m.used_last - (m.used_first or 0)
    shmem = host.row("shmem") if host is not None else None
    if shmem is not None and shmem.growth and shmem.growth > 0:  # how much of the host's Shmem growth it is
        f["shm.top_mount_share"] = 100.0 * growth / shmem.growth
    if m.patterns:
        # files that accumulate first: one file that swells and shrinks (a neighbour's buffer) is
        # not what the mount's new files are, whatever its size at the window's end
        pat, files0, files1, bytes0, bytes1 = max(m.patterns, key=lambda p: (p[2] > p[1], p[4] - p[3], p[4]))
        f.update(
            {
                "shm.top_pattern": f"{m.mount_point.rstrip('/')}/{pat}",
                "shm.top_pattern_files": files1,
                "shm.top_pattern_files_growth": files1 - files0,
                "shm.top_pattern_bytes": bytes1,
                "shm.top_pattern_growth": bytes1 - bytes0,
            }
        )
    return f


def _makers(obs: Observation) -> set[int] | None:
    """The processes whose segments are the target's: the pid's, the cgroup's at any sample (None:
    the whole system's, every segment)."""
    t = obs.target
    if t.kind == "system":
        return None
    if t.kind == "pid":
        return {t.pid} if t.pid is not None else set()
    return {pid for snap in obs.snapshots if snap.cgroup is not None for pid in snap.cgroup.procs}


def new_segments(obs: Observation) -> list[ShmSegment]:
    """System V segments the target's processes created during the window and did not remove, largest
    first: each lives, attached or not, until IPC_RMID; their creator is the kernel's shm_cpid."""
    if obs.sysv_first is None or obs.sysv_last is None:
        return []
    makers = _makers(obs)
    before = {(g.shmid, g.cpid) for g in obs.sysv_first}
    new = [g for g in obs.sysv_last if (g.shmid, g.cpid) not in before and (makers is None or g.cpid in makers)]
    return sorted(new, key=lambda g: -g.size)


def _sysv_facts(obs: Observation, new: list[ShmSegment]) -> dict:
    """The facts of the segments the target made in the window (new_segments)."""
    if obs.sysv_first is None or obs.sysv_last is None:
        return {}
    f: dict = {"sysv.new_segments": len(new), "sysv.new_bytes": sum(resident(g) for g in new)}
    if obs.sysv_unread is not None:
        f["sysv.unread_processes"] = obs.sysv_unread
    if new:
        by: dict[int, list[ShmSegment]] = {}
        for g in new:
            by.setdefault(g.cpid, []).append(g)
        cpid, mine = max(by.items(), key=lambda kv: (len(kv[1]), sum(g.size for g in kv[1])))
        big = max(mine, key=lambda g: g.size)
        f.update(
            {
                "sysv.segments": len(obs.sysv_last),
                "sysv.top_creator": str(cpid),
                "sysv.top_creator_segments": len(mine),
                "sysv.top_creator_bytes": sum(resident(g) for g in mine),
                # where the kernel prints no rss column, the figure is their size: said in the text
                "sysv.top_creator_held": "resident" if all(g.rss is not None for g in mine) else "in size",
                "sysv.top_creator_unattached": sum(1 for g in mine if g.nattch == 0),
                "sysv.top_key": "IPC_PRIVATE" if big.key == 0 else f"{big.key:#x}",
                "sysv.top_size": big.size,
                "sysv.top_shmid": str(big.shmid),
            }
        )
        # made in both halves of the window and still there: growth over the window, not a count
        half = (obs.started + obs.ended) / 2
        if all(g.ctime is not None for g in mine):
            f["sysv.top_creator_early"] = sum(1 for g in mine if g.ctime < half)
            f["sysv.top_creator_late"] = sum(1 for g in mine if g.ctime >= half)
    return f


def anon_split_facts(split: L.AnonSplit | None) -> dict:
    """The facts of the anonymous memory's split by holder: what the allocator holds free, in use,
    what the runtime's figures account for, what no reader attributes; a share of the anonymous
    memory read with them. A part no reader gave is left out (unknown), never zero."""
    if split is None:
        return {}
    f: dict = {}
    keys = {p.key for p in split.parts}
    if "allocator_free" in keys:
        free = split.value("allocator_free") or 0
        f["ledger.process.anon_allocator_free"] = free
        f["ledger.process.anon_allocator_free_share"] = _share(free, split.total)
    if "allocator_in_use" in keys:
        f["ledger.process.anon_allocator_in_use"] = split.value("allocator_in_use")
    runtime = [p.bytes for p in split.parts if p.key.startswith("runtime_")]
    if runtime:
        f["ledger.process.anon_runtime"] = sum(runtime)
    if split.residual is not None:
        f["ledger.process.anon_unattributed"] = split.residual
        f["ledger.process.anon_unattributed_share"] = _share(split.residual, split.total)
    return f


def ledger_facts(ledgers: list[LedgerReport], shm: list[ShmFiles], obs: Observation, sysv: list[ShmSegment]) -> dict:
    """The facts of the ledgers (catalogued by ledger_fact_defs)."""
    f: dict = {}
    for led in ledgers:
        f.update(_scope_facts(led))
        if led.scope == "process":
            f.update(_fd_facts(led, obs))
            f.update(anon_split_facts(led.anon_split))
            pte, rss = led.row("page_tables"), led.total_growth
            if pte is not None and pte.growth is not None and rss and rss > 0:
                f["ledger.process.page_tables_per_rss_growth"] = 100.0 * pte.growth / rss
    f.update(_shm_facts(shm, next((led for led in ledgers if led.scope == "host"), None)))
    f.update(_sysv_facts(obs, sysv))
    if obs.sockets_last is not None:
        f["sockets.count"], f["sockets.peer_gone"] = obs.sockets_last.sockets, obs.sockets_last.peer_gone
    return f


def build_oom_ledger(kills: list) -> LedgerReport | None:
    """The cgroup's ledger at the latest memcg OOM kill the log reported with its cgroup's memory.stat."""
    for kill in reversed(kills):
        led = L.oom_cgroup_ledger(kill)
        if led is None:
            continue
        summed = {x.key for x in led.lines}
        rows = [
            LedgerRow(key=x.key, label=x.label, summed=x.key in summed, last=x.bytes) for x in [*led.lines, *led.beside]
        ]
        where = kill.memcg_stat_path or kill.oom_memcg
        subject = f"cgroup {where} at the OOM kill of PID {kill.victim_pid} ({kill.victim_comm})"
        return LedgerReport(
            scope="cgroup", subject=subject, total_label="usage", total_last=led.total, rows=rows, unknown=led.unknown
        )
    return None


def held_text(led: LedgerReport, n: int = 3) -> str:
    """The lines holding most of a total, each with its share, and the residual: what filled it."""
    held = [r for r in led.rows if r.summed and r.key != L.RESIDUAL and r.last]
    held.sort(key=lambda r: -(r.last or 0))
    words = [f"{r.label} {fmt_bytes(r.last)} ({_share(r.last, led.total_last) or 0:.0f}%)" for r in held[:n]]
    res = led.row(L.RESIDUAL)
    if res is not None and res.last is not None:
        words.append(f"{res.label.split(' (')[0]} {fmt_bytes(res.last)}")
    return f"{led.total_label} {fmt_bytes(led.total_last)} = " + ", ".join(words)
