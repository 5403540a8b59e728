"""Which root a held block is credited to: its nearest (fewest references between), the better tier
among roots as near; on hand-made reference graphs, so each case is exact."""

from __future__ import annotations

import numpy as np
from memdiag.probes.memleak.reach.graph import reachability
from memdiag.probes.memleak.reach.match import Found
from memdiag.probes.memleak.reach.model import TIER_NONE, TIER_STACK, TIER_STATIC, TIER_UNTRACKED


def _found(tiers: list[int], edges: list[tuple[int, int]]) -> Found:
    n = len(tiers)
    return Found(
        root_tier=np.array(tiers, dtype=np.int8),
        root_addr=np.zeros(n, dtype=np.uint64),
        root_region=np.zeros(n, dtype=np.int32),
        root_tid=np.zeros(n, dtype=np.int64),
        edges=[np.array(edges, dtype=np.int32).reshape(-1, 2)],
    )


def test_a_block_pointed_at_from_the_runtimes_heap_is_its_not_a_stacks_that_reaches_a_list():
    # Node: one stack word points at the head (0) of the engine's list of array buffers (0 -> 1 ->
    # 2 -> 3), and a JavaScript object in V8's heap (untracked memory) points at each of 1, 2, 3
    N, S, U = TIER_NONE, TIER_STACK, TIER_UNTRACKED
    anchored, seed_of, _ = reachability(4, _found([S, U, U, U], [(0, 1), (1, 2), (2, 3)]))
    assert anchored.all()
    assert seed_of.tolist() == [0, 1, 2, 3]  # each its own nearest root, none the stack's
    # a list only a stack's local holds is the stack's, however long
    anchored, seed_of, _ = reachability(4, _found([S, N, N, N], [(0, 1), (1, 2), (2, 3)]))
    assert anchored.all() and seed_of.tolist() == [0, 0, 0, 0]


def test_among_roots_as_near_the_better_tier_wins_and_unreached_blocks_are_leaked():
    N, ST, U = TIER_NONE, TIER_STATIC, TIER_UNTRACKED
    # 2 is one reference from a global's block (0) and one from untracked memory's (1): the global's
    anchored, seed_of, referenced = reachability(5, _found([U, ST, N, N, N], [(0, 2), (1, 2), (3, 4)]))
    assert seed_of[2] == 1
    assert anchored.tolist() == [True, True, True, False, False]  # 3 -> 4 with no root: leaked
    assert referenced.tolist() == [False, False, True, False, True]


def test_untraced_chunks_are_links_from_the_roots_first_and_roots_only_for_what_nothing_else_reaches():
    # A global (0 is the bucket array no trace saw allocated, pointed at from .bss) -> untraced node 1
    # -> traced block 2; an untraced chunk 3 nothing reaches (freed, or held in a way memdiag cannot
    # see) points at block 4 and at block 2. Chunks 1 and 3 are late: 2 is the global's, 4 is the
    # untraced chunk's (potentially live: never called leaked), 5 is leaked.
    N, S = TIER_NONE, TIER_STATIC
    late = np.array([True, True, False, True, False, False])
    anchored, seed_of, _ = reachability(6, _found([S, N, N, N, N, N], [(0, 1), (1, 2), (3, 4), (3, 2)]), late)
    assert anchored.tolist() == [True, True, True, True, True, False]
    assert seed_of.tolist() == [0, 0, 0, 3, 3, -1]
    # without the late wave chunk 3 would be a root like any (what the scan did before): nearer to 2
    anchored, seed_of, _ = reachability(6, _found([S, N, N, TIER_UNTRACKED, N, N], [(0, 1), (1, 2), (3, 4), (3, 2)]))
    assert seed_of.tolist() == [0, 0, 3, 3, 3, -1]


def test_a_free_chunk_is_no_link_from_the_roots_only_potentially_live_after():
    # The thread's tcache (0, from TLS) points at free chunk 1, whose stale word points at traced block
    # 2; an untraced chunk in use (3, reached from a global: 4's holder) points at 5. 2 is the free
    # chunk's (second wave), not the tcache's; 5 the global's.
    N, S, T = TIER_NONE, TIER_STATIC, 1  # 1: TIER_TLS
    late = np.array([True, True, False, True, False, False])
    free = np.array([False, True, False, False, False, False])
    found = _found([T, N, N, N, S, N], [(0, 1), (1, 2), (4, 3), (3, 5)])
    anchored, seed_of, _ = reachability(6, found, late, free)
    assert anchored.all()
    assert seed_of.tolist() == [0, 1, 1, 4, 4, 4]
