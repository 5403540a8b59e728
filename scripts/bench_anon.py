"""BENCHMARKS.md section 12: what reading glibc malloc's own bookkeeping costs (the process ledger's
anonymous memory by who holds it, read once as a window closes): the time of one read of its
arenas (main_arena found, each bin and fastbin followed) against the number of free chunks it
follows, up to the walk's bound. The target is not stopped: the read is of /proc/PID/mem."""

from __future__ import annotations

import time

from bench_common import median_range
from kit import Workload
from memdiag.probes.memleak import glibcheap

TITLE = "## 12. The allocator's bookkeeping: what reading glibc malloc's arenas costs"
# (blocks, bytes each): a heap of 100 MiB in big blocks, then ever more free chunks of small ones
SHAPES = ((1600, 64 << 10), (40_000, 1024), (200_000, 256), (400_000, 128))


def anon_section(runs: int) -> list[str]:
    lines = [
        TITLE,
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. Target: `fragment BLOCKS SIZE` "
        "(that many blocks written, three of every four freed: each run of three merged into one free "
        "chunk the allocator keeps). One read: `glibcheap.read_arena_stats` (the libc banner, main_arena "
        f"found in libc's data, every list followed, the top's pages in pagemap, mp_ found); bound "
        f"{glibcheap.MAX_FREE_CHUNKS:,} chunks and {glibcheap.MAX_WALK_SECONDS * 1000:.0f} ms of the reader's CPU.",
        "",
        "| target | free chunks followed | free bytes found / freed | walk complete | time of one read |",
        "|---|---|---|---|---|",
    ]
    for blocks, size in SHAPES:
        times: list[float] = []
        chunks, found, complete = 0, 0, True
        with Workload("fragment", str(blocks), str(size)) as w:
            freed = int(w.proc.stdout.readline().decode().split()[1])
            for _ in range(runs):
                t = time.monotonic()
                stats = glibcheap.read_arena_stats(w.pid)
                times.append((time.monotonic() - t) * 1000)
                if stats is None:
                    complete = False
                    continue
                chunks, found, complete = stats.free_chunks, stats.free, complete and stats.complete
        share = f"{100 * found / freed:.1f}%" if freed else "–"
        lines.append(
            f"| {blocks:,} x {size:,} B | {chunks:,} | {share} | {'yes' if complete else 'no: a lower bound'} "
            f"| {median_range(times, '{:.1f}')} ms |"
        )
    return lines + [""]
