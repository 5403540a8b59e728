"""Event counters from /proc/vmstat. Rates come from two readings (see ``system.trends``)."""

from __future__ import annotations

from pathlib import Path

from ._parse import Fact, int_or_none, kv_lines, read_text

# The counters the diagnosis reads. Families are summed where the kernel splits them by
# zone or reclaimer (allocstall_* by zone; pgscan_/pgsteal_ by kswapd/direct/khugepaged).
TRACKED = (
    "pswpin",
    "pswpout",
    "pgfault",
    "pgmajfault",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "pgsteal_direct",
    "oom_kill",
    "workingset_refault_anon",
    "workingset_refault_file",
)


class VmStat(Fact):
    """Cumulative counters since boot. ``allocstall`` is the sum of allocstall_<zone>."""

    counters: dict[str, int]

    def get(self, name: str) -> int | None:
        return self.counters.get(name)


def parse_vmstat(text: str) -> VmStat:
    raw = kv_lines(text)
    counters: dict[str, int] = {}
    for name in TRACKED:
        value = int_or_none(raw.get(name))
        if value is not None:
            counters[name] = value
    stalls = [int_or_none(v) for k, v in raw.items() if k.startswith("allocstall_")]
    stalls_known = [s for s in stalls if s is not None]
    if stalls_known:
        counters["allocstall"] = sum(stalls_known)
    return VmStat(counters=counters)


def read_vmstat(root: Path = Path("/proc")) -> VmStat:
    text = read_text(root / "vmstat")
    return parse_vmstat(text) if text is not None else VmStat(counters={})
