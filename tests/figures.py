"""Every number in the report is true: the figures of the verdict and the findings, read back from
their text and checked against report.json's tables (counters, trends, processes, OOM kills,
stacks, probes) within the rounding of the unit shown.

A figure is found by its unit (B..GiB, /min, ms..days, %, /s) or its noun (kills, faults, blocks,
times). What it must match depends on how it is said: an unqualified growth rate is the whole
window's (the Trends table's rate), a rate "in the last N s" the latest third's; "N kills" is the
kernel's counter over the window, "the kernel log holds N" the OOM-kills table; a projection
("in ~N min") is the limit's (or MemAvailable's) headroom over the whole window's rate. A
duration never reads "0 s", and "see lost" stands only beside lost figures."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from memdiag.rules.catalog import FACTS

_BYTES = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SECONDS = {"ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}
_NUM = r"(\d[\d,]*(?:\.\d+)?)"

# (pattern, kind, pool); the first group is the number, the second (if any) its unit. Order matters:
# a matched span is blanked before the later patterns run ("MiB/min" is a rate, not bytes and minutes).
_PATTERNS = [
    (r"<(1) ms", "tiny", "tiny"),
    (rf"{_NUM} (B|KiB|MiB|GiB|TiB)/min in the last {_NUM} (ms|s|min|h)", "recent", "recent"),
    (rf"{_NUM} (B|KiB|MiB|GiB|TiB)/min", "rate", "rate"),
    (rf"-?{_NUM} (B|KiB|MiB|GiB|TiB)\b", "bytes", "bytes"),
    (r"~" + _NUM + r" (ms|s|min|h|days)\b", "seconds", "projection"),
    (rf"{_NUM} (ms|s|min|h|days)\b", "seconds", "seconds"),
    (rf"{_NUM}(?: pages| stalls| times)?/s\b", "per_s", "per_s"),
    (rf"{_NUM}%", "percent", "percent"),
    (rf"the kernel log holds {_NUM}", "count", "kmsg"),
    (rf"{_NUM} kills\b", "count", "kills"),
    (rf"{_NUM} in the window", "count", "kills"),
    (rf"{_NUM} (?:OOM kill\(s\)|process\(es\))", "count", "kills_ever"),
    (rf"{_NUM} faults\b", "count", "faults"),
    (rf"{_NUM} times in the window", "count", "limit_hits"),
    (rf"{_NUM} blocks\b", "count", "blocks"),
]


@dataclass
class Figure:
    text: str
    value: float
    tolerance: float
    pool: str


@dataclass
class Pools:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, pool: str, *values: float | None) -> None:
        self.values.setdefault(pool, []).extend(float(v) for v in values if v is not None)

    def has(self, fig: Figure) -> bool:
        if fig.pool == "tiny":  # "<1 ms": some duration of the tables is under half a millisecond
            return any(0 < v < 0.0005 for v in self.values.get("seconds", []))
        return any(abs(abs(v) - fig.value) <= fig.tolerance for v in self.values.get(fig.pool, []))


def _number(text: str) -> tuple[float, float]:
    """A shown number and half its last digit: the rounding it may carry."""
    digits = text.replace(",", "")
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    return float(digits), 0.5 * 10**-decimals + 1e-9


def parse_figures(text: str) -> list[Figure]:
    figures = []
    for pattern, kind, pool in _PATTERNS:
        for m in re.finditer(pattern, text):
            value, tol = _number(m.group(1))
            if kind == "tiny":
                value, tol, unit = 0.0, 0.0005, 1.0
            elif kind in ("rate", "recent"):
                unit = _BYTES[m.group(2)] / 60
            elif kind == "bytes":
                unit = _BYTES[m.group(2)]
            elif kind == "seconds":
                unit = _SECONDS[m.group(2)]
            else:
                unit = 1.0
            figures.append(Figure(m.group(0), value * unit, tol * unit, pool))
            if kind == "recent":
                span, span_tol = _number(m.group(3))
                scale = _SECONDS[m.group(4)]
                figures.append(Figure(m.group(0), span * scale, span_tol * scale, "recent_seconds"))
            text = text[: m.start()] + " " * (m.end() - m.start()) + text[m.end() :]
    return figures


def _delta(row: dict) -> float | None:
    return row["last"] - row["first"] if row.get("first") is not None and row.get("last") is not None else None


def _rows(rep: dict) -> dict[tuple[str, str], dict]:
    return {(r["scope"], r["name"]): r for r in rep["counters"]["rows"]}


def table_pools(rep: dict) -> Pools:
    """Every value the report's tables show, by what a figure of the text may be checked against."""
    p = Pools()
    c = rep["counters"]
    rows = _rows(rep)
    for r in c["rows"]:
        pool = {"bytes": "bytes", "percent": "percent", "count": "count"}.get(r["unit"], "per_s")
        p.add(pool, r.get("first"), r.get("last"), _delta(r))
        if r.get("rate_per_s") is not None:
            p.add("per_s", r["rate_per_s"])
        if r["unit"] in ("count", "per_s"):
            p.add("counts_all", r.get("first"), r.get("last"), _delta(r))
    for tr in c["trends"].values():
        p.add("bytes", tr.get("first"), tr.get("last"), tr.get("low"), tr.get("peak"), tr.get("delta"))
        p.add("bytes", *(tr.get("troughs") or []), *(tr.get("peaks") or []))  # a sawtooth's falls
        p.add("rate", tr.get("rate_per_s"))
        p.add("recent", tr.get("recent_rate_per_s"))
        p.add("recent_seconds", tr.get("recent_seconds"))
        p.add("seconds", tr.get("seconds"), tr.get("levelled_for_s"), tr.get("recent_seconds"))
    for proc in c.get("processes", []):
        growth = (proc.get("rss_last") or 0) - (proc.get("rss_first") or 0)
        p.add("bytes", proc.get("rss_first"), proc.get("rss_last"), growth)
        p.add("faults", proc.get("majflt_delta"))
    p.add("faults", _delta(rows.get(("process", "majflt"), {})))
    for k in c["oom_kills"]:
        p.add("bytes", k.get("anon_rss"), k.get("file_rss"), k.get("shmem_rss"))
    p.add("kmsg", len(c["oom_kills"]))
    cg_kills = rows.get(("cgroup", "oom_kill"))
    p.add("kills", _delta(cg_kills) if cg_kills else None, _delta(rows.get(("system", "oom_kill"), {})))
    p.add("kills_ever", cg_kills.get("last") if cg_kills else None)
    p.add("limit_hits", _delta(rows.get(("cgroup", "failcnt"), {})))
    for s in c["slab_top"]:
        p.add("bytes", s["first_bytes"], s["last_bytes"], s["last_bytes"] - s["first_bytes"])
    for d in c["swap_devices"]:
        p.add("bytes", d.get("size"), d.get("used"))
    _ledger_pools(p, c)
    _stack_pools(p, rep)
    _probe_pools(p, rep)
    _derived_pools(p, rep, rows)
    return p


def _ledger_pools(p: Pools, c: dict) -> None:
    """The ledgers' lines (first, last, change), each line's share of its total (and of the total's
    change), the tmpfs mounts and their file patterns."""
    ledgers = [*c.get("ledgers", []), *([c["oom_ledger"]] if c.get("oom_ledger") else [])]
    for led in ledgers:
        t0, t1 = led.get("total_first"), led.get("total_last")
        growth = t1 - t0 if t0 is not None and t1 is not None else None
        p.add("bytes", t0, t1, growth)
        rows = {r["key"]: r for r in led["rows"]}
        for r in led["rows"]:
            a, b = r.get("first"), r.get("last")
            g = b - a if a is not None and b is not None else None
            p.add("bytes", a, b, g)
            if g is not None and growth:
                p.add("percent", 100 * g / growth)
            if b is not None and t1:
                p.add("percent", 100 * b / t1)
        pte, rss = rows.get("page_tables"), growth
        if led["scope"] == "process" and pte and pte.get("first") is not None and rss:
            p.add("percent", 100 * (pte["last"] - pte["first"]) / rss)
    for led in c.get("ledgers", []):  # a process's anonymous memory by who holds it, with its residual
        split = led.get("anon_split")
        if split:
            total = split.get("total")
            values = [part["bytes"] for part in split["parts"]] + [split.get("residual")]
            p.add("bytes", total, split.get("moved"), *values)
            p.add("percent", *(100 * v / total for v in values if v is not None and total))
            p.add("bytes", *(v for k, v in led.get("detail_totals", {}).items()))
    for m in c.get("shm", []):
        p.add("bytes", m.get("used_first"), m["used_last"])
        if m.get("used_first") is not None:
            p.add("bytes", m["used_last"] - m["used_first"])
        for _pat, _f0, _f1, b0, b1 in m["patterns"]:
            p.add("bytes", b0, b1, b1 - b0)
    by_creator: dict[int, int] = {}
    for g in c.get("sysv", []):
        p.add("bytes", g["size"], g.get("rss"))
        by_creator[g["cpid"]] = by_creator.get(g["cpid"], 0) + g["size"]
    p.add("bytes", *by_creator.values())  # a creator's segments, summed


def _stack_pools(p: Pools, rep: dict) -> None:
    for s in rep["stacks"]:
        p.add("bytes", s["bytes"])
        r = s.get("reach")
        if r:
            p.add("bytes", r.get("leaked_bytes"), r.get("anchored_bytes"), r.get("anchor_bytes"))
            p.add("blocks", r.get("leaked_count"), r.get("anchored_count"), r.get("unreferenced_count"))


def _probe_pools(p: Pools, rep: dict) -> None:
    for probe in rep["probes"]:
        p.add("seconds", probe.get("duration_s"))
        for name, value in probe.get("figures", {}).items():
            kind = FACTS[name].kind if name in FACTS else "number"
            pool = {"bytes_per_s": "rate", "number": "blocks"}.get(kind, kind)
            p.add(pool, value)


def _derived_pools(p: Pools, rep: dict, rows: dict) -> None:
    """Figures the text derives from two table values: shares, headroom, time to exhaustion."""
    w = rep["window"]
    p.add("seconds", w["ended"] - w["started"], w["requested_s"])
    last = {k: r.get("last") for k, r in rows.items()}
    total, avail = last.get(("system", "mem_total")), last.get(("system", "mem_available"))
    if total and avail is not None:
        p.add("percent", 100 * avail / total)
    limit, usage = last.get(("cgroup", "effective_limit")), last.get(("cgroup", "usage"))
    headroom = []
    if limit and usage is not None:
        p.add("percent", 100 * usage / limit)
        p.add("bytes", max(0, limit - usage))
        headroom.append(max(0, limit - usage))
    if avail is not None:
        headroom.append(avail)
    usage = rep["counters"]["trends"].get("cgroup.usage") or {}
    if (usage.get("delta") or 0) > 0:  # a process's share of its cgroup's growth (the process table's)
        for r in rep["counters"].get("processes", []):
            if r.get("rss_first") is not None and r.get("rss_last") is not None:
                p.add("percent", 100 * (r["rss_last"] - r["rss_first"]) / usage["delta"])
    for tr in rep["counters"]["trends"].values():
        rate = abs(tr.get("rate_per_s") or 0)
        if rate > 0:
            p.add("projection", *(h / rate for h in headroom))


def check_figures(rep: dict) -> list[str]:
    """What in the verdict and the findings no table of the report bears out (empty: all true)."""
    pools = table_pools(rep)
    texts = [("verdict", rep["verdict"]["summary"])]
    texts += [(f"finding {f['id']}", f["summary"]) for f in rep["findings"]]
    problems = []
    for where, text in texts:
        for fig in parse_figures(text):
            if fig.pool in ("seconds", "projection") and fig.value == 0:
                problems.append(f"{where}: {fig.text!r}: a duration rounded to nothing")
            elif not pools.has(fig):
                problems.append(f"{where}: {fig.text!r} matches no value of the report's {fig.pool} tables")
        problems += _list_problems(where, text, rep)
    for probe in rep["probes"]:
        if "see lost" in probe["reason"] and not probe.get("lost"):
            problems.append(f"probe {probe['name']}: says 'see lost' but the report has no lost figures for it")
    return problems


def _list_problems(where: str, text: str, rep: dict) -> list[str]:
    """Each process a list names is one of the target's processes (the report's process table)."""
    listed = {r["pid"] for r in rep["counters"].get("processes", [])}
    out = []
    for part in re.findall(r"(?:paying in major faults|largest|fastest growing process is)[^;]*", text):
        for pid in re.findall(r"PID (\d+)", part):
            if int(pid) not in listed:
                out.append(f"{where}: PID {pid} in {part.split(':')[0]!r} is not one of the target's processes")
    return out


def read_report(out: Path, memdiag_pid: int | None = None) -> dict:
    """report.json of a diagnosis, once every figure of its verdict and findings is checked against
    its tables, and memdiag (when its pid is known) is in none of its process lists: every
    end-to-end scenario's report passes through here (tests/conftest.py)."""
    rep = json.loads((out / "report.json").read_text())
    problems = check_figures(rep)
    if memdiag_pid in {r["pid"] for r in rep["counters"].get("processes", [])}:
        problems.append(f"memdiag itself (PID {memdiag_pid}) is in the report's process table")
    assert not problems, "figures the report's tables do not bear out:\n" + "\n".join(problems)
    return rep
