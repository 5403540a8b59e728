"""The counters in words: from an Observation and its Counters to findings, caveats and the
descriptive `summary.*` facts (an OOM kill, the pressure figures, the growth series' shape).

No thresholds, no verdicts and no precedence live here: those are the playbook's rules
(playbooks/default.yaml). Counters tell the shape of the growth, never its cause."""

from __future__ import annotations

import time

from memdiag.system.kmsg import OomKill
from memdiag.system.trends import Trend
from memdiag.system.units import fmt_bytes, fmt_duration, fmt_number, fmt_rate

from .evidence import own_pids
from .ledgers import build_oom_ledger, held_text
from .observe import Observation
from .report import TARGET_SERIES, Counters, Culprit, Finding, ProcessRow


class Triage:
    """What the counters say in words: findings, caveats, the descriptive `summary.*` facts the
    playbook's verdicts quote, and the culprit each reading names (oom: the victim; growth: the
    target, or its fastest grower). No verdict and no threshold: those are the playbook's."""

    def __init__(
        self,
        findings: list[Finding],
        caveats: list[str],
        facts: dict[str, str],
        culprits: dict[str, Culprit],
        keys: dict[str, str] | None = None,
    ):
        self.findings, self.caveats, self.facts, self.culprits = findings, caveats, facts, culprits
        self.keys = keys or {}  # finding id -> the summary.* fact it states (a playbook finding of it is the same)


def _who(obs: Observation) -> str:
    return obs.target.describe()  # the one description of a target, as {target.name} says it too


def _cgroup_path(obs: Observation) -> str | None:
    return obs.target.cgroup.path if obs.target.cgroup is not None else None


def _growth_series(obs: Observation, counters: Counters) -> tuple[str, Trend] | None:
    for name in TARGET_SERIES:
        if name in counters.trends:
            return name, counters.trends[name]
    return None


def _top_growers(counters: Counters, n: int = 3) -> list[ProcessRow]:
    """The target's processes by RSS growth over the window (the counters' process table)."""
    return sorted(counters.processes, key=lambda r: (r.growth, r.rss_last or 0), reverse=True)[:n]


def _biggest(counters: Counters, n: int = 3) -> list[ProcessRow]:
    return sorted(counters.processes, key=lambda r: r.rss_last or 0, reverse=True)[:n]


def _limit_and_usage(obs: Observation) -> tuple[int | None, int | None]:
    cg = obs.last_cgroup
    if cg is None or cg.effective_limit is None:
        return None, None
    return cg.effective_limit, cg.usage


def _projection(obs: Observation, rate: float) -> str | None:
    """When the limit (or MemAvailable) runs out at this rate: an estimate, said as one."""
    if rate <= 0 or not obs.snapshots:
        return None
    limit, usage = _limit_and_usage(obs)
    if limit is not None and usage is not None:
        left = max(0, limit - usage)
        if left == 0:  # a worker the limit kills over and over ends the window at it
            return f"the cgroup's usage is at its limit {fmt_bytes(limit)} already"
        when = "under a second" if left / rate < 1 else f"~{fmt_duration(left / rate)}"
        return (
            f"at that rate the cgroup limit {fmt_bytes(limit)} ({fmt_bytes(left)} left) is reached in {when} "
            "(an estimate)"
        )
    avail = obs.snapshots[-1].meminfo.mem_available
    if avail is not None:
        return f"at that rate MemAvailable ({fmt_bytes(avail)}) runs out in ~{fmt_duration(avail / rate)} (an estimate)"
    return None


def _growth_text(what: str, who: str, tr: Trend) -> str:
    """The whole window's rate and span; the latest third's rate only named as such."""
    text = f"{what} of {who} grew {fmt_rate(tr.rate_per_s)} over {fmt_duration(tr.seconds)} "
    text += f"({fmt_bytes(tr.first)} to {fmt_bytes(tr.last)}"
    if fmt_bytes(tr.first) == fmt_bytes(tr.last):  # "1.0 GiB to 1.0 GiB" alone reads as no growth
        text += f", +{fmt_bytes(tr.delta)}"
    recent, whole = tr.recent_rate_per_s, tr.rate_per_s or 0.0
    if recent is not None and tr.recent_seconds and abs(recent - whole) > 0.1 * abs(whole):
        text += f"; {fmt_rate(recent)} in the last {fmt_duration(tr.recent_seconds)}"
    return text + ")"


def _oom_findings(obs: Observation, kills: list[OomKill]) -> list[Finding]:
    findings = []
    avail = obs.snapshots[-1].meminfo if obs.snapshots else None
    for k in kills:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(k.when)) if k.when else "unknown time"
        scope = f"cgroup OOM in {k.oom_memcg}" if k.cgroup_oom else "system OOM"
        trigger = f"{k.trigger_comm} (PID {k.trigger_pid})" if k.trigger_pid else (k.trigger_comm or "unknown")
        findings.append(
            Finding(
                id="oom-kill",
                summary=(
                    f"OOM killer killed PID {k.victim_pid} ({k.victim_comm}) at {when}: {scope}, "
                    f"anon RSS {fmt_bytes(k.anon_rss)}, triggered by {trigger}"
                ),
                evidence={
                    "victim_pid": k.victim_pid,
                    "victim_comm": k.victim_comm,
                    "when": k.when,
                    "constraint": k.constraint,
                    "oom_memcg": k.oom_memcg,
                    "task_memcg": k.task_memcg,
                    "trigger_comm": k.trigger_comm,
                    "trigger_pid": k.trigger_pid,
                    "anon_rss": k.anon_rss,
                    "file_rss": k.file_rss,
                    "shmem_rss": k.shmem_rss,
                    "host_mem_available_now": avail.mem_available if avail else None,
                    "source": "kernel log (/dev/kmsg)",
                },
            )
        )
    return findings


def oom_kills_in_window(obs: Observation) -> tuple[int | None, str]:
    """OOM kills during the window by the kernel's own counter, and which counter: the cgroup's
    (memory.oom_control / memory.events oom_kill) for a target in one, vmstat's for the host."""
    if not obs.snapshots:  # the target exited before the first sample: no counter was read
        return None, ""
    first, last, last_cg = obs.snapshots[0], obs.snapshots[-1], obs.last_cgroup
    if last_cg is not None and last_cg.path != "/" and first.cgroup is not None:
        a, b = first.cgroup.oom_kill, last_cg.oom_kill
        if a is not None and b is not None:
            return b - a, "the cgroup's oom_kill counter"
    a, b = first.vmstat.get("oom_kill"), last.vmstat.get("oom_kill")
    if a is not None and b is not None:
        return b - a, "vmstat oom_kill"
    return None, ""


def _in_window(obs: Observation) -> str:
    n, source = oom_kills_in_window(obs)
    return f", {n} in the window" if n is not None and source.startswith("the cgroup") else ""


def _kill_count(obs: Observation, kills: list[OomKill]) -> str | None:
    """How many kills: the counter's figure for the window, the kernel log's records as examples."""
    n, source = oom_kills_in_window(obs)
    if n is None:
        return f"the kernel log holds {len(kills)} kills (no kernel counter to count them)" if len(kills) > 1 else None
    if n <= 1 and len(kills) <= 1:
        return None
    text = f"{n} kills in the window ({source})"
    if kills:
        text += f"; the kernel log holds {len(kills)} (the OOM kills table)"
    return text


def _oom_summary(obs: Observation, kills: list[OomKill], cg_kills: int | None) -> tuple[str, Culprit] | None:
    """The OOM kill in words (victim, the limit or the host, the host's memory, how many kills) and
    its culprit: present when the kernel log holds kills, or a cgroup target's counter recorded some."""
    target = obs.target
    last_cg = obs.last_cgroup
    limit = last_cg.effective_limit if last_cg else None
    meminfo = obs.snapshots[-1].meminfo if obs.snapshots else None
    if not kills and not (target.kind == "cgroup" and cg_kills):
        return None
    victim = kills[-1] if kills else None
    cgroup_killed = victim.cgroup_oom if victim else target.kind == "cgroup"
    parts = []
    if victim is not None:
        parts.append(f"OOM killer killed PID {victim.victim_pid} ({victim.victim_comm})")
    else:
        parts.append(f"{_who(obs)} has recorded {cg_kills} OOM kill(s) (memory.oom_control/events)")
    if cgroup_killed:
        memcg = (victim.oom_memcg if victim and victim.oom_memcg else _cgroup_path(obs)) or "its cgroup"
        parts.append(f"at its cgroup limit ({memcg}, limit {fmt_bytes(limit)})" if limit else f"in cgroup {memcg}")
        # the host's memory beside the limit; whether that clears the host is the playbook's call
        if meminfo and meminfo.mem_available is not None and meminfo.available_percent is not None:
            parts.append(
                f"while the host has {fmt_bytes(meminfo.mem_available)} available "
                f"({meminfo.available_percent:.1f}% of RAM)"
            )
    else:
        parts.append("system out of memory")
    summary = "; ".join(parts[:1]) + " " + ", ".join(parts[1:])
    count = _kill_count(obs, kills)
    if count:
        summary += f"; {count}"
    at_kill = build_oom_ledger(kills) if cgroup_killed else None
    if at_kill is not None:  # what filled the cgroup, as the kernel reported its memory.stat at the kill
        summary += f"; at the kill its {held_text(at_kill)}"
    culprit = Culprit(
        pid=victim.victim_pid if victim else None,
        comm=victim.victim_comm if victim else None,
        cgroup=(victim.task_memcg if victim else None) or _cgroup_path(obs),
    )
    return summary, culprit


def limit_hits(obs: Observation) -> int | None:
    """Times the target's cgroup hit its limit in the window (the fact cgroup.limit_hits); None
    when unknown (no cgroup, no failcnt at either end)."""
    first, last = obs.snapshots[0].cgroup, obs.last_cgroup
    if first is None or last is None or first.failcnt is None or last.failcnt is None:
        return None
    return last.failcnt - first.failcnt


def _pressure_where(obs: Observation) -> str:
    """Where pressure would be felt. PSI, swap-in, direct reclaim and MemAvailable are the host's
    figures; only a cgroup that hit its limit is the target's own. Host-wide pressure is not put on
    a target that did not pay for it (pod's trial: a container was called "under pressure" from
    another test's swap-off)."""
    who, t = _who(obs), obs.target
    if t.kind == "system" or (t.kind == "cgroup" and (limit_hits(obs) or 0) > 0):
        return who
    cg = obs.last_cgroup
    if t.kind == "pid" and cg is not None and (limit_hits(obs) or 0) > 0:
        return f"cgroup {cg.path}, at its limit (seen from {who})"  # the cgroup's hits, not the pid's own
    return f"the host (host-wide counters, seen from {who})"


def _pressure_cgroup(obs: Observation) -> str | None:
    """The target's cgroup as the pressure it pays in its own memory.pressure is said (cgroup v2);
    None where it has no PSI of its own (v1, no cgroup)."""
    cg, who = obs.last_cgroup, _who(obs)
    if cg is None or cg.pressure is None:
        return None
    if obs.target.kind == "cgroup":
        return f"{who}, its own tasks (memory.pressure)"
    return f"cgroup {cg.path}, its own tasks (memory.pressure; seen from {who})"


def _pressure_context(obs: Observation, counters: Counters, growth: _Growth) -> str:
    """What stands behind pressure, whichever signs of it the playbook finds: the growth, who pays
    in major faults, who is biggest. The figures themselves are the sign rules' findings."""
    who = _who(obs)
    text = []
    if growth.kind == "growth" and growth.summary:
        # said beside the pressure, not as its cause: whether it is one is for the reader (and the
        # playbook: the target's own verdict outranks the host's pressure it did not pay for)
        text.append(f"in the window, {growth.summary}")
    payers = sorted((r for r in counters.processes if r.majflt_delta), key=lambda r: -(r.majflt_delta or 0))
    if payers:
        text.append(
            "paying in major faults: "
            + ", ".join(f"PID {p.pid} ({p.comm}, {fmt_number(p.majflt_delta)} faults)" for p in payers[:3])
        )
    big = _biggest(counters)
    if big:
        text.append("largest: " + ", ".join(f"PID {p.pid} ({p.comm}, {fmt_bytes(p.rss_last)})" for p in big))
    if not payers:  # a target that paid neither way is said so by the playbook's host-memory-pressure
        text.append(f"no major fault in {who} during the window")
    return "; ".join(text)


# The growth series' readings, each the summary.* fact it becomes.
SUMMARY_FACTS = {
    "growth": "summary.growth",
    "plateau": "summary.plateau",
    "sawtooth": "summary.sawtooth",
    "cut_by_oom": "summary.cut_by_oom",
}


class _Growth:
    """What the growth series says: findings, caveats, its sentence by name (growth, plateau,
    sawtooth, cut_by_oom: the `summary.*` fact it becomes) and the culprit it names."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.caveats: list[str] = []
        self.kind: str | None = None
        self.summary: str | None = None
        self.culprit: Culprit | None = None
        self.finding: str | None = None  # the id of the finding that states the summary


def _falls_text(peaks: list[float], troughs: list[float]) -> str:
    """A sawtooth's falls as the evidence of its base: each trough and peak, in order (the first
    three and the last where there are more)."""

    def some(values: list[float]) -> str:
        shown = values if len(values) <= 4 else [*values[:3], values[-1]]
        text = [fmt_bytes(v) for v in shown]
        return ", ".join(text[:-1] + (["…", text[-1]] if len(values) > 4 else text[-1:]))

    n = len(troughs)
    falls = f"it fell {n} time{'s' if n > 1 else ''} and rose again"
    return f"{falls}, to troughs of {some(troughs)} from peaks of {some(peaks)}"


def kills_during(obs: Observation, counters: Counters) -> int:
    """OOM kills of the target during the window: its cgroup's counter, or the kernel log's records
    where they say more (the counter's last sample can precede a kill that ended the target: its
    pid target gone, the sampling stopped)."""
    n, source = oom_kills_in_window(obs)
    logged = sum(1 for k in counters.oom_kills if k.when is not None and k.when >= obs.started - 1.0)
    if n is not None and source.startswith("the cgroup"):
        return max(n, logged)
    return logged


def _said(out: _Growth, kind: str, summary: str, finding: str, evidence: dict) -> _Growth:
    out.kind, out.summary, out.finding = kind, summary, finding
    out.findings.append(Finding(id=finding, summary=summary, evidence=evidence))
    return out


def _growth(obs: Observation, counters: Counters, growth: tuple[str, Trend]) -> _Growth:
    out = _Growth()
    name, tr = growth
    who, target = _who(obs), obs.target
    what = "RSS" if name == "process.rss" else "memory usage"
    evidence = {"series": name, **tr.model_dump()}
    out.culprit = Culprit(pid=target.pid, comm=target.comm, cgroup=_cgroup_path(obs))
    top = _top_growers(counters, 1) if target.kind == "cgroup" else []
    if top:
        out.culprit = Culprit(pid=top[0].pid, comm=top[0].comm, cgroup=_cgroup_path(obs))
    if tr.shape == "climbing":
        summary = _growth_text(what, who, tr) + " and is still climbing"
        proj = _projection(obs, tr.rate_per_s or 0.0)
        return _said(out, "growth", summary + (f"; {proj}" if proj else ""), "growth-climbing", evidence)
    if tr.shape == "levelled" and (killed := kills_during(obs, counters)):
        # A level reached between OOM kills is what the last kill left, not a cache's bound: the kernel
        # cut the growth (CI saw a 32 MiB OOM loop sampled flat for 2.4 s between kills).
        summary = (
            f"{what} of {who} ended at {fmt_bytes(tr.last)} (between {fmt_bytes(tr.low)} and {fmt_bytes(tr.peak)} "
            f"over {fmt_duration(tr.seconds)}) with {killed} OOM kill{'s' if killed > 1 else ''} in the window"
        )  # what it means (the kernel cut the growth) is the playbook's: level-cut-by-oom
        return _said(out, "cut_by_oom", summary, "growth-killed", {**evidence, "oom_kills": killed})
    if tr.shape == "levelled":
        summary = (
            f"{what} of {who} grew {fmt_bytes(tr.delta)} then levelled off at {fmt_bytes(tr.last)} "
            f"for the last {fmt_duration(tr.levelled_for_s)} of {fmt_duration(tr.seconds)}"
        )  # what it is consistent with (a bounded cache) is the playbook's: plateau
        out.caveats.append(
            "counters show the shape of growth, not its cause: a leak that paused also looks like a plateau for a while"
        )
        return _said(out, "plateau", summary, "growth-plateau", evidence)
    if tr.shape == "sawtooth":
        summary = (
            f"{what} of {who} rose and fell over {fmt_duration(tr.seconds)}, between {fmt_bytes(tr.low)} and "
            f"{fmt_bytes(tr.peak)} ({fmt_bytes(tr.last)} at the end)"
        )  # why no rate describes it is the playbook's: sawtooth; whether it is bounded, sawtooth-level's
        if tr.troughs and tr.peaks:
            summary += f"; {_falls_text(tr.peaks, tr.troughs)}"
        return _said(out, "sawtooth", summary, "growth-sawtooth", evidence)
    if tr.shape == "shrinking":
        out.findings.append(
            Finding(
                id="shrinking", summary=f"{what} of {who} shrank by {fmt_bytes(-(tr.delta or 0))}", evidence=evidence
            )
        )
    return out


def _system_growth(obs: Observation, counters: Counters) -> _Growth:
    """The whole system: MemAvailable falling, and the process that grew most (never memdiag)."""
    out = _Growth()
    tr = counters.trends.get("system.mem_available")
    top = _top_growers(counters, 3)
    if obs.target.kind != "system" or tr is None or tr.shape != "shrinking" or not top or top[0].growth <= 0:
        return out
    p = top[0]
    rate = -(tr.rate_per_s or 0.0)
    summary = (
        f"MemAvailable fell {fmt_rate(rate)} over {fmt_duration(tr.seconds)}; the fastest "
        f"growing process is PID {p.pid} ({p.comm}, +{fmt_bytes(p.growth)} RSS)"
    )
    proj = _projection(obs, rate)
    if proj:
        summary += f"; {proj}"
    out.findings.append(
        Finding(id="system-growth", summary=summary, evidence={"top_growers": [q.model_dump() for q in top]})
    )
    out.kind, out.summary, out.finding = "growth", summary, "system-growth"
    out.culprit = Culprit(pid=p.pid, comm=p.comm)
    return out


def _caveats(obs: Observation) -> list[str]:
    caveats = []
    if obs.exited_at is not None:
        caveats.append(
            f"{_who(obs)} exited {_into_window(obs, obs.exited_at)}; the evidence covers the time it ran"
            + ("; its pid then belonged to another process, which memdiag did not observe" if obs.pid_reused else "")
        )
    if obs.execd_at is not None:
        caveats.append(
            f"{_who(obs)} exec'd {obs.exec_exe or 'another program'} {_into_window(obs, obs.execd_at)}: "
            "the evidence covers the program it ran before; what that program allocated was freed with its image"
        )
    if obs.interrupted:
        caveats.append("the window was cut short by an interrupt; trends cover less time than asked")
    return caveats + _own_memory_caveat(obs)


def _into_window(obs: Observation, at: float) -> str:
    """When in the window something happened: `5 s into the 30 s window (12:00:05)`."""
    return (
        f"{fmt_duration(at - obs.started)} into the {fmt_duration(obs.requested_s)} window "
        f"({time.strftime('%H:%M:%S', time.localtime(at))})"
    )


def _own_memory_caveat(obs: Observation) -> list[str]:
    """memdiag inside the cgroup whose counters the report quotes (a sidecar in the pod, one cgroup
    for a whole host): its own memory is charged there, the process table leaves it out."""
    cg = obs.last_cgroup
    own = own_pids(obs) & set(cg.procs) if cg is not None else set()
    if not own:
        return []

    def rss(table: dict) -> int:
        return sum(table[p].rss or 0 for p in own if p in table)

    last, first = rss(obs.processes_last), rss(obs.processes_first)
    grew = last - first
    return [
        f"memdiag itself runs in cgroup {cg.path}, so the cgroup's counters include its own memory (its RSS "
        f"{fmt_bytes(last)} at the end, {'+' if grew >= 0 else '-'}{fmt_bytes(abs(grew))} over the window); "
        "the process table leaves it out"
    ]


def _vsz_caveat(obs: Observation) -> list[str]:
    """VSZ is not RSS: a reservation that grows without pages behind it is not memory used."""
    if not (obs.snapshots and obs.snapshots[0].process and obs.snapshots[-1].process):
        return []
    a, b = obs.snapshots[0].process, obs.snapshots[-1].process
    if not (a.vm_size and b.vm_size and a.rss is not None and b.rss is not None):
        return []
    vsz_growth, rss_growth = b.vm_size - a.vm_size, b.rss - a.rss
    if vsz_growth <= 4 * max(rss_growth, 1 << 20):
        return []
    return [
        f"VSZ grew {fmt_bytes(vsz_growth)} but RSS only {fmt_bytes(rss_growth)}: "
        "address space reserved, not memory used (VSZ is not RSS)"
    ]


def _oom_part(obs: Observation, counters: Counters) -> tuple[list[Finding], tuple[str, Culprit] | None]:
    last_cg = obs.last_cgroup
    cg_kills = last_cg.oom_kill if last_cg else None
    findings = _oom_findings(obs, counters.oom_kills[-3:])  # the latest as examples: the table has them all
    if last_cg is not None and cg_kills:
        findings.append(
            Finding(
                id="cgroup-oom-count",
                summary=(
                    f"cgroup {last_cg.path} has OOM-killed {cg_kills} process(es) since it was created"
                    f"{_in_window(obs)} (limit {fmt_bytes(last_cg.effective_limit)})"
                ),
                evidence={"oom_kill": cg_kills, "limit": last_cg.effective_limit, "cgroup": last_cg.path},
            )
        )
    return findings, _oom_summary(obs, counters.oom_kills, cg_kills)


def triage(obs: Observation, counters: Counters) -> Triage:
    """The counters in words. Each `summary.*` fact is there when its reading applies (an OOM kill,
    the growth series' shape, the window's pressure figures); the playbook decides which is the verdict."""
    caveats = _caveats(obs)
    if not obs.snapshots:
        return Triage([], caveats, {}, {})
    findings, oom = _oom_part(obs, counters)
    growth = _growth_series(obs, counters)
    g = _growth(obs, counters, growth) if growth is not None else _system_growth(obs, counters)
    findings += g.findings
    caveats += g.caveats + _vsz_caveat(obs)
    facts = {"pressure.where": _pressure_where(obs), "summary.pressure_context": _pressure_context(obs, counters, g)}
    facts["pressure.cgroup"] = _pressure_cgroup(obs)
    culprits: dict[str, Culprit] = {}
    if oom is not None:
        facts["summary.oom"], culprits["oom"] = oom
    keys = {}
    if g.kind is not None and g.summary is not None:
        facts[SUMMARY_FACTS[g.kind]] = g.summary
        if g.finding is not None:
            keys[g.finding] = SUMMARY_FACTS[g.kind]
    if g.culprit is not None and g.kind in ("growth", "plateau"):
        culprits["growth"] = g.culprit
    return Triage(findings, caveats, facts, culprits, keys)


def memory_shape(counters: Counters) -> str:
    """The shape of the target's own memory series: its RSS for a process, its usage for a cgroup."""
    for name in TARGET_SERIES:
        if name in counters.trends:
            return counters.trends[name].shape
    return "unknown"


def memory_base(counters: Counters) -> str | None:
    """Whether the target's own memory, a sawtooth, came back to the same base (system/trends.py)."""
    for name in TARGET_SERIES:
        if name in counters.trends:
            return counters.trends[name].base
    return None


# The series memory.level reads, first found first, each with what a sentence calls it: for the
# whole system it is MemAvailable, which a sentence must not pass off as the memory in use.
LEVEL_SERIES = {
    "process.rss": "RSS",
    "cgroup.usage": "memory usage",
    "system.mem_available": "available memory (MemAvailable)",
}


def _level_series(counters: Counters) -> str | None:
    return next((name for name in LEVEL_SERIES if name in counters.trends), None)


def memory_level(counters: Counters) -> int | None:
    """Where the target's memory ended: its RSS or usage, or MemAvailable for the whole system."""
    name = _level_series(counters)
    return counters.trends[name].last if name is not None else None


def memory_measure(counters: Counters) -> str | None:
    """What memory.level is, in words: 'RSS', 'memory usage', 'available memory (MemAvailable)'."""
    name = _level_series(counters)
    return LEVEL_SERIES[name] if name is not None else None
