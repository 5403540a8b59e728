"""Each BPF program's `stats` array by name: the enums of bpf/memdiag.h mirrored once, in their
order (tests/unit/test_bpf_stats.py checks that the two sides agree), so that no loader reads a
statistic by its number."""

from __future__ import annotations

# enum stack_stat: faults, mmapsnoop, brkstack
STACK = ("events", "stack_errors", "samples_dropped", "keys_dropped", "python_stacks_dropped")
# enum fd_stat: fdstack
FD = ("created", "closed", "stack_errors", "samples_dropped", "keys_dropped", "fds_dropped")
# enum shmw_stat: shmwriter
SHMW = ("created", "removed", "stack_errors", "samples_dropped", "keys_dropped", "made_dropped")
# enum kmem_stat: kmemstack
KMEM = ("allocs", "frees", "stack_errors", "kstack_errors", "samples_dropped", "keys_dropped", "objs_dropped",
        "reused")  # fmt: skip
# enum table_stat: swapin, drsnoop
TABLE = ("events", "table_full")
# enum oom_stat: oomkill
OOM = ("events", "stack_errors")
# enum stat: memleak
MEMLEAK = (
    "allocs",
    "frees",
    "stack_errors",
    "allocs_dropped",
    "unknown_frees",
    "failed_allocs",
    "samples_dropped",
    "stacks_dropped",
    "sampled_out",
    "nested",
    "python_stacks_dropped",
)
# enum site_stat: sites (memleak narrowed to one function's call sites)
SITES = ("hits", "null", "stack_errors", "blocks_dropped", "samples_dropped", "calls_dropped", "call_hits",
         "frees_emulated", "frees_stepped", "freed")  # fmt: skip

# the C enum each tuple mirrors (its constants' prefix), for the test that compares them
ENUMS = {
    "stack_stat": STACK,
    "fd_stat": FD,
    "shmw_stat": SHMW,
    "kmem_stat": KMEM,
    "table_stat": TABLE,
    "oom_stat": OOM,
    "memleak_stat": MEMLEAK,
    "site_stat": SITES,
}


def read(bpf, names: tuple[str, ...]) -> dict[str, int]:
    """The program's `stats` array, each slot by its name (names: one of the tuples above)."""
    table = bpf["stats"]
    return {name: table[i].value for i, name in enumerate(names)}
