"""From references to leaked and anchored: anchored is reachable from a root, directly or through
other anchored blocks; each credited to its nearest root (the better tier among roots as near); per
stack, its blocks by what holds them."""

from __future__ import annotations

from collections import deque

from ...face import StackReach
from .match import Found
from .model import TIER_NONE, Blocks


def reachability(n: int, found: Found, late=None, blocked=None) -> tuple:
    """(anchored bool per block, seed block per anchored block, referenced-by-a-block per block).
    late (a bool per block, or None): blocks that are roots only for what no other root reaches, in
    a second walk once the first is done: the chunks memleak did not trace (untraced.py) are links
    of paths from the roots first, and potentially live memory (roots) after. blocked (a bool per
    block, or None): late blocks the first walk neither starts from nor enters (free chunks: their
    words are stale, and the allocator's caches point at them)."""
    import numpy as np

    edges = np.concatenate(found.edges) if found.edges else np.zeros((0, 2), dtype=np.int32)
    edges = edges[edges[:, 0] != edges[:, 1]]  # a block pointing into itself anchors nothing
    referenced = np.zeros(n, dtype=bool)
    referenced[edges[:, 1]] = True
    order = np.argsort(edges[:, 0], kind="stable")
    src, dst = edges[order, 0], edges[order, 1]
    first = np.searchsorted(src, np.arange(n + 1))
    seed_of = np.full(n, -1, dtype=np.int64)
    dst_list = dst.tolist()
    first_list = first.tolist()
    # Credit each anchored block to its nearest root, the better tier among roots as near: one breadth
    # first walk from every block a root points at, seeded in tier order. Nearest, as a heap analyser's
    # retainers are ordered by distance: a block a V8 heap object points at straight away is V8's, not
    # held by the one stack word that reaches the head of the engine's list of all array buffers.
    seeds = np.flatnonzero(found.root_tier != TIER_NONE)
    seeds = seeds[np.argsort(found.root_tier[seeds], kind="stable")]
    if blocked is not None:
        seeds = seeds[~blocked[seeds]]
    # a blocked block looks reached to the first walk (never entered), then is unmarked for the second
    seed_of[blocked if blocked is not None else []] = n
    for wave in (seeds, None if late is None else np.flatnonzero(late)):
        if wave is None:
            break
        if wave is not seeds:
            if blocked is not None:
                seed_of[blocked & (seed_of == n)] = -1
            wave = wave[seed_of[wave] < 0]
        seed_of[wave] = wave
        queue = deque(wave.tolist())
        while queue:
            b = queue.popleft()
            for d in dst_list[first_list[b] : first_list[b + 1]]:
                if seed_of[d] < 0:
                    seed_of[d] = seed_of[b]
                    queue.append(d)
    if blocked is not None:
        seed_of[seed_of == n] = -1  # blocked and never reached (no late wave)
    return seed_of >= 0, seed_of, referenced


def stack_figures(blocks: Blocks, anchored, seed_of, referenced, labels: dict[int, tuple[str, str]]) -> dict:
    import numpy as np

    out: dict[int, StackReach] = {}
    sizes = blocks.sizes.astype(np.int64)
    for g in np.unique(blocks.groups).tolist():
        if g < 0:  # a chunk memleak did not trace (untraced.py): a link, no stack's
            continue
        mine = blocks.groups == g
        held = mine & anchored
        lost = mine & ~anchored
        r = StackReach(
            leaked_count=int(lost.sum()),
            leaked_bytes=int(sizes[lost].sum()),
            unreferenced_count=int((lost & ~referenced).sum()),
            anchored_count=int(held.sum()),
            anchored_bytes=int(sizes[held].sum()),
        )
        if r.anchored_count:
            by_anchor: dict[tuple[str, str], int] = {}
            for b, size in zip(np.flatnonzero(held).tolist(), sizes[held].tolist(), strict=True):
                key = labels[int(seed_of[b])]
                by_anchor[key] = by_anchor.get(key, 0) + size
            (kind, name), held_bytes = max(by_anchor.items(), key=lambda kv: kv[1])
            r = r.model_copy(update={"anchor": name, "anchor_kind": kind, "anchor_bytes": held_bytes})
        out[g] = r
    return out
