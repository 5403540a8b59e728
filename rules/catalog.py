"""Every fact a rule may name: its kind of unit and what it means. Rule files are checked against
this list when they are loaded, so a misspelt fact is an error with a suggestion, never a rule
that silently never fires. The counters' facts are listed here and computed by
memdiag.diagnose.factset; each probe's are declared by its face (probes/face.py), each runtime's by
its runtime face (probes/runtime.py), and read from the registry the first time the catalog is asked
for (the rule model imports no probe)."""

from __future__ import annotations

import functools

from memdiag.probes.face import FactDef
from memdiag.probes.registry import REGISTRY
from memdiag.system.ledger import ledger_fact_defs

_DEFS = [
    # the target
    ("target.kind", "string", "pid, cgroup or system"),
    ("target.exited", "bool", "the target process exited during the window"),
    ("target.execd", "bool", "the target process exec'd another program during the window (the window ended there)"),
    ("target.exec", "string", "the program the target exec'd (its executable's path)"),
    ("target.name", "string", "the target as a person reads it: PID 123 (orderd), cgroup /x, the system"),
    ("target.pid", "string", "the target's process id, as commands take it (no thousands separator)"),
    ("target.command", "string", "the target's command line, quoted for a shell"),
    (
        "target.runtime_detail",
        "string",
        "the runtime, its version and the module holding its code: "
        "Go 1.19.8 (/usr/bin/prometheus; module github.com/prometheus/prometheus/cmd/prometheus)",
    ),
    ("window.seconds", "seconds", "how long the counters were watched"),
    ("window.samples", "number", "how many counter samples the window holds (a trend needs three)"),
    # a long window watched in cycles (diagnose/cycles.py); absent in a window watched in one go
    ("window.cycles", "number", "cycles a long window was watched in so far (the probes run again in each)"),
    ("window.cycles_traced", "number", "cycles in which allocation stacks were recorded"),
    ("window.cycles_leaking", "number", "cycles whose reachability scan found blocks nothing points at"),
    ("window.leak_function", "string", "the function whose blocks nothing pointed at in the most cycles"),
    ("window.leak_function_cycles", "number", "in how many cycles window.leak_function's blocks were leaked"),
    (
        "memory.shape",
        "string",
        "the target's own memory series (RSS of a process, usage of a cgroup): climbing, levelled, sawtooth, "
        "flat, shrinking or unknown",
    ),
    (
        "memory.shape_while_traced",
        "string",
        "the target's own memory series over the run that traced its allocations (climbing, levelled, flat, ...; "
        "unknown: none ran)",
    ),
    (
        "memory.sawtooth_base",
        "string",
        "a sawtooth's base: level (its troughs and its peaks did not rise out of their scatter, and its last "
        "trough stands no more than 256 KiB above the earlier ones), rising, or unknown (no sawtooth, or under "
        "two falls it rose again from)",
    ),
    ("memory.level", "bytes", "where that series ended (MemAvailable for the whole system)"),
    (
        "memory.measure",
        "string",
        "what memory.level is, for a sentence: RSS, memory usage, or available memory (MemAvailable)",
    ),
    # memdiag verify: the earlier report a diagnosis follows up (absent in a plain diagnosis)
    ("verify.baseline_kind", "string", "memdiag verify: the earlier report's verdict (leak, growth, cache, ...)"),
    ("verify.baseline_function", "string", "memdiag verify: the function the earlier report's verdict named"),
    # system
    ("system.mem_total", "bytes", "MemTotal"),
    ("system.mem_available", "bytes", "MemAvailable at the end of the window"),
    ("system.mem_available_percent", "percent", "MemAvailable as a share of MemTotal"),
    ("system.mem_available_rate", "bytes_per_s", "change of MemAvailable (negative: falling)"),
    ("system.swap_total", "bytes", "SwapTotal"),
    ("system.swap_used", "bytes", "swap in use"),
    ("system.swapin_rate", "per_s", "pages swapped in per second (pswpin)"),
    ("system.swapout_rate", "per_s", "pages swapped out per second (pswpout)"),
    ("system.majfault_rate", "per_s", "major faults per second"),
    ("system.direct_reclaim_rate", "per_s", "allocation stalls in direct reclaim per second"),
    ("system.oom_kills", "number", "OOM kills during the window (vmstat oom_kill)"),
    ("system.psi_some", "percent", "share of the window some task stalled on memory (PSI)"),
    ("system.psi_full", "percent", "share of the window all tasks stalled on memory (PSI)"),
    ("system.sunreclaim_growth", "bytes", "growth of unreclaimable slab over the window"),
    ("system.top_grower_growth", "bytes", "RSS growth of the fastest-growing process"),
    ("system.top_grower_pid", "string", "the fastest-growing process's id, as commands take it"),
    ("system.mem_available_shape", "string", "MemAvailable over the window: climbing, shrinking, flat ..."),
    # process
    ("process.rss", "bytes", "RSS at the end of the window"),
    ("process.rss_anon", "bytes", "anonymous RSS"),
    ("process.rss_growth", "bytes", "RSS change over the window"),
    ("process.rss_rate", "bytes_per_s", "RSS growth rate over the latest part of the window"),
    ("process.rss_shape", "string", "climbing, levelled, sawtooth, flat, shrinking or unknown"),
    ("process.vsz_growth", "bytes", "VSZ change over the window"),
    ("process.swap", "bytes", "VmSwap"),
    ("process.majfault_rate", "per_s", "major faults per second of the process"),
    ("process.oom_killed", "bool", "the kernel log shows the OOM killer took the target"),
    # memory cgroup
    ("cgroup.usage", "bytes", "memory usage of the target's cgroup"),
    ("cgroup.limit", "bytes", "the lowest memory limit up the cgroup tree"),
    ("cgroup.usage_percent", "percent", "usage as a share of the limit"),
    ("cgroup.limit_hits", "number", "times the limit was hit during the window"),
    (
        "pressure.where",
        "string",
        "where the pressure is felt: the whole system, a cgroup target that hit its limit, a pid's cgroup "
        "that did, else the host (its host-wide counters, seen from the target)",
    ),
    (
        "pressure.cgroup",
        "string",
        "the target's cgroup as the pressure it paid in its own memory.pressure is said (cgroup v2; absent on v1)",
    ),
    (
        "pressure.target_major_faults",
        "number",
        "major faults the target's processes (its process table) took in the window",
    ),
    (
        "pressure.target_swap",
        "bytes",
        "the target's pages in swap at the end (VmSwap, its cgroup's swap, the system's): its major faults "
        "can be swap-ins only when it has some",
    ),
    ("cgroup.oom_kills", "number", "OOM kills the cgroup has recorded since it was created"),
    (
        "cgroup.psi_some",
        "percent",
        "share of the window some task of the target's cgroup stalled on memory (its own memory.pressure, "
        "cgroup v2; absent on v1)",
    ),
    ("cgroup.psi_full", "percent", "share of the window all tasks of the target's cgroup stalled on memory (v2)"),
    ("cgroup.anon", "bytes", "anonymous memory of the target's cgroup (memory.stat anon; v1 total_rss)"),
    ("cgroup.file", "bytes", "page cache of the target's cgroup (memory.stat file; v1 total_cache)"),
    (
        "memory.thp_collapses",
        "number",
        "huge pages khugepaged collapsed in the window (the cgroup's memory.stat thp_collapse_alloc, else "
        "the host's vmstat): a fall of up to 2 MiB each beside one is not read as the target shrinking",
    ),
    ("cgroup.usage_rate", "bytes_per_s", "growth rate of the cgroup's usage"),
    ("cgroup.usage_shape", "string", "climbing, levelled, sawtooth, flat, shrinking or unknown"),
    ("oom.kills", "number", "OOM kills that concern the target (kernel log)"),
    ("oom.cgroup_limit", "bool", "the latest of them was a cgroup limit's (not the host's)"),
    (
        "oom.kills_in_window",
        "number",
        "OOM kills of the target during the window: its cgroup's counter, else the kernel log's records",
    ),
    # what the counters say, in words (present when the reading applies; the rules decide which is the verdict)
    ("summary.oom", "string", "the OOM kill: victim, trigger, cgroup limit, host memory, how many kills"),
    (
        "summary.pressure_context",
        "string",
        "what stands behind memory pressure: the growth, who pays in major faults, who is biggest",
    ),
    ("summary.growth", "string", "memory still climbing: rate, duration, projection to the limit"),
    ("summary.plateau", "string", "growth that levelled off: how much, where, for how long"),
    ("summary.sawtooth", "string", "memory that rose and fell (kills, restarts, flushes): its low, peak and end"),
    ("summary.cut_by_oom", "string", "memory that levelled off with OOM kills in the window: where, how many kills"),
    # the cgroup's refaults: pages of its page cache read back soon after reclaim evicted them
    ("cgroup.refaults", "number", "file pages of the cgroup refaulted in the window (workingset_refault_file)"),
    ("cgroup.refault_rate", "per_s", "those refaults per second: the file-backed working set no longer fits"),
    ("cgroup.processes", "number", "processes in the target's cgroup at the window's end (memdiag's own aside)"),
    (
        "cgroup.top_grower_pid",
        "string",
        "a cgroup target's process whose RSS grew most over the window (its process table), as commands take it",
    ),
    ("cgroup.top_grower_growth", "bytes", "how much that process's RSS grew over the window"),
    (
        "cgroup.top_grower_share",
        "percent",
        "that process's RSS growth as a share of the cgroup's usage growth over the window (unknown where the "
        "usage did not grow)",
    ),
    ("slab.top_cache", "string", "the slab cache that grew most over the window (/proc/slabinfo)"),
    ("slab.top_cache_growth", "bytes", "how much that cache grew"),
    # the budget
    ("budget.percent", "percent", "how much the diagnosis may slow the target"),
]


def facts() -> dict[str, FactDef]:
    """The catalog: the counters' facts, then every probe's, in the registry's order, then every
    runtime's."""
    return _catalog(REGISTRY.probes, REGISTRY.runtimes)


@functools.lru_cache(maxsize=4)
def _catalog(_probes: tuple, _runtimes: tuple) -> dict[str, FactDef]:
    """Built once per list of probes and runtimes (a test's registry with one more is another list)."""
    runtimes = ", ".join(REGISTRY.runtime_names())
    runtime = f"the runtime the target runs: {runtimes}, none (native code), unknown (not a process)"
    own = [FactDef("target.runtime", "string", runtime)]
    own += [FactDef(name, kind, help) for name, kind, help in [*_DEFS, *ledger_fact_defs()]]  # type: ignore[arg-type]
    out = {f.name: f for f in own}
    for f in REGISTRY.fact_defs():
        if f.name in out:
            raise ValueError(f"fact `{f.name}` is declared twice (a probe's face and the catalog, or two faces)")
        out[f.name] = f
    return out


def __getattr__(name: str):
    if name == "FACTS":  # the catalog as a constant, built on first use
        return facts()
    raise AttributeError(name)
