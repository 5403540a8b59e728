"""Reading whether a block is still allocated from glibc's own chunk headers and free lists, on a
real process that keeps and frees blocks in every state malloc keeps them in (tests/workloads/
chunks.c): a thread's cache, a fastbin, the unsorted bin, merged, unmapped, another thread's arena."""

from pathlib import Path

from memdiag.probes.memleak import glibcheap
from memdiag.probes.memleak.glibcheap import State


def _blocks(w) -> list[tuple[str, int, int]]:
    """(kept or freed, size asked, address) as the workload printed them."""
    out = []
    for line in w.proc.stdout:
        words = line.decode().split()
        if words == ["done"]:
            return out
        out.append((words[0], int(words[1]), int(words[2])))
    raise AssertionError(f"the workload ended early: {out}")


def test_every_block_reads_as_the_program_left_it(workload):
    w = workload("chunks")
    blocks = _blocks(w)
    with glibcheap.Memory(w.pid) as mem:
        heap = glibcheap.read_heap(mem, Path(f"/proc/{w.pid}/maps").read_text())
        states = {(what, size, at): glibcheap.state(mem, heap, at) for what, size, at in blocks}
    assert heap.minor is not None and heap.minor >= glibcheap.MIN_MINOR
    assert heap.tcache_key is not None  # learned from the main thread's cache
    # main_arena found, and the thread's own arena through its list: the three 40-byte chunks that
    # did not fit their tcache bin are on a fastbin
    assert heap.arenas == 2 and heap.fastbin_free is not None and len(heap.fastbin_free) >= 3
    reused = {at for what, _s, at in blocks if what == "kept"}  # a freed address handed out again
    for (what, size, at), st in states.items():
        want = State.ALLOCATED if what == "kept" or at in reused else State.FREE
        assert st == want, (what, size, hex(at), st)
    # every kind of free chunk was there to be read
    freed = {size for what, size, at in blocks if what == "freed" and at not in reused}
    assert {24, 40, 48, 100, 500, 3000, 50000, 300000} <= freed


def test_what_is_no_block_is_unknown_not_allocated(workload):
    w = workload("chunks")
    blocks = _blocks(w)
    kept = next(at for what, size, at in blocks if what == "kept" and size == 50000)
    with glibcheap.Memory(w.pid) as mem:
        heap = glibcheap.read_heap(mem, Path(f"/proc/{w.pid}/maps").read_text())
        # inside a block (its bytes are 1s: no header), and a misaligned pointer
        assert glibcheap.state(mem, heap, kept + 4096) == State.UNKNOWN
        assert glibcheap.state(mem, heap, kept + 8) == State.UNKNOWN
