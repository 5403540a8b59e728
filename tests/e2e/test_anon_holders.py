"""A process's anonymous memory split by who holds it, on real processes: glibc's malloc holding
most of its heap free after the program freed it (tests/workloads/fragment.c), and a real JVM
whose Java heap is a part of it. The parts and the residual add up to the anonymous memory read
with them; the allocator's figures are read from its own bookkeeping in the target's memory."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from jvmkit import have_jdk, wait_warmed_up
from kit import wait_until
from memdiag.diagnose.ledgers import anon_split_facts, build_ledgers
from memdiag.diagnose.observe import Sampler
from memdiag.diagnose.target import pid_target
from memdiag.probes.memleak import glibcheap
from memdiag.probes.registry import REGISTRY
from memdiag.system.ledger import AnonSplit

MiB = 1 << 20
HEAP_MAX = 64 * MiB  # a glibc thread arena's heap (HEAP_MAX_SIZE, x86-64)


def _split(pid: int, runtime=None) -> AnonSplit:
    """A short window of the process, closed as the engine closes it: its ledger's split."""
    sampler = Sampler(pid_target(pid), duration=0.5, interval=0.1, runtime=runtime)
    sampler.run()
    (process, *_rest) = build_ledgers(sampler.so_far(closing=True))
    assert process.scope == "process" and process.anon_split is not None
    split = process.anon_split
    assert split.total and sum(p.bytes for p in split.parts) + split.residual == split.total
    return split


def test_what_malloc_holds_free_after_the_program_freed_it_is_its_free_chunks(workload):
    w = workload("fragment")
    words = w.proc.stdout.readline().decode().split()
    assert words[0] == "freed"
    freed, kept = int(words[1]), int(words[2])
    split = _split(w.pid)
    free, in_use = split.value("allocator_free"), split.value("allocator_in_use")
    assert free is not None and in_use is not None, split.unread
    # every block freed is on malloc's bins (headers and the main thread's cache add a little)
    assert freed <= free <= freed + MiB, (free, freed)
    # the blocks kept, with their headers and what the C library allocated for itself
    assert kept <= in_use <= kept + MiB, (in_use, kept)
    assert split.residual is not None and 0 <= split.residual < free  # the rest: stacks, libraries' data
    facts = anon_split_facts(split)
    assert facts["ledger.process.anon_allocator_free"] == free
    assert facts["ledger.process.anon_allocator_free_share"] > 50  # three of every four blocks freed


def test_a_go_program_has_its_heap_from_its_pacer_and_no_allocator_part(workload):
    """A static Go program links no glibc: the allocator's parts are absent, not zero, and said;
    its heap is said by the runtime's own GC pacer, read from its memory."""
    w = workload("goleak", "100")
    split = _split(w.pid)  # without its runtime's face: nothing but the residual
    assert not [p for p in split.parts if p.key.startswith("allocator_")]
    assert any(u.startswith("glibc malloc: not read") for u in split.unread)
    assert split.residual == split.total  # all of it unattributed
    assert "ledger.process.anon_allocator_free" not in anon_split_facts(split)
    face = REGISTRY.runtime(REGISTRY.recognise(w.pid).name)
    assert face is not None and face.name == "go"
    split = _split(w.pid, face)
    heap = next(p for p in split.parts if p.key == "runtime_heap")
    assert heap.source == "Go's GC pacer (runtime.gcController)" and heap.estimate
    assert 0 < heap.bytes <= split.total
    assert anon_split_facts(split)["ledger.process.anon_runtime"] >= heap.bytes


def test_a_node_programs_v8_heap_is_a_part_of_its_anonymous_memory(workload):
    w = workload("nodeheap")
    face = REGISTRY.runtime(REGISTRY.recognise(w.pid).name)
    assert face is not None and face.name == "node"
    said = json.loads(w.proc.stdout.readline())  # process.memoryUsage(), before the split: it keeps every object
    split = _split(w.pid, face)
    heap = next(p for p in split.parts if p.key == "runtime_heap")
    assert heap.source == "V8's mappings (smaps)" and 0 < heap.bytes < split.total
    assert heap.bytes >= said["heapUsed"]  # the objects V8 holds are in pages it touched
    assert "allocator_in_use" in {p.key for p in split.parts}  # node's own malloc, beside it


@pytest.mark.skipif(not have_jdk(), reason="needs a JDK (scripts/setup.sh --test installs openjdk-17)")
def test_a_jvms_java_heap_is_a_part_of_its_anonymous_memory(java):
    w = java("LruCache", "1000", "4000", jvm=["-Xmx256m"])
    wait_warmed_up(w.pid)
    face = REGISTRY.runtime(REGISTRY.recognise(w.pid).name)
    assert face is not None and face.name == "jvm"

    def cache_full() -> bool:  # its 4,000 values of 16 KiB in the heap (the JVM's own counter of it)
        sample = face.sample(w.pid, Path("/proc"))
        return sample.counters is not None and sample.counters.heap_used >= 64 * MiB

    wait_until(cache_full, "the cache's 64 MiB in the Java heap")
    split = _split(w.pid, face)
    parts = {p.key: p for p in split.parts}
    heap = parts["runtime_heap"]
    # the cache's values are on the Java heap, resident, and the heap is below the anonymous memory
    assert 64 * MiB <= heap.bytes < split.total
    assert heap.source == "the JVM's counters and its mappings" and not heap.estimate
    assert {"runtime_code", "runtime_stacks"} <= set(parts)
    assert parts["runtime_code"].bytes > 0 and parts["runtime_stacks"].bytes > 0
    # the JVM's own malloc (its C++ objects, the JIT's arenas) is read beside it
    assert "allocator_in_use" in parts and parts["allocator_in_use"].bytes > 0


def test_the_report_splits_the_anonymous_memory_and_says_what_the_allocator_holds_free(memdiag, workload, tmp_path):
    """`memdiag --pid` on the same heap: every format carries the split, its figures those of its
    tables (the fixture checks them), and the playbook's finding says the RSS is free chunks."""
    w = workload("fragment")
    freed = int(w.proc.stdout.readline().decode().split()[1])
    r = memdiag("--pid", str(w.pid), "--duration", "2", "--output", str(tmp_path))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    split = rep["counters"]["ledgers"][0]["anon_split"]
    free = next(p["bytes"] for p in split["parts"] if p["key"] == "allocator_free")
    assert freed <= free <= freed + MiB
    finding = next(f for f in rep["findings"] if f["id"] == "allocator-holds-free")
    assert "is free chunks its allocator holds" in finding["summary"]
    md = (tmp_path / "report.md").read_text()
    assert "#### Its anonymous memory by who holds it" in md and "| anonymous memory no reader attributes |" in md
    assert "The detail column was read as the window closed" in md
    assert "anonymous memory no reader attributes" in (tmp_path / "report.html").read_text()


def test_a_walk_past_its_bound_is_a_lower_bound_and_leaves_in_use_unknown(workload):
    """Ten times more free chunks than the walk follows: what it counted is kept and said to be a
    lower bound, and blocks in use (its arenas less what is free) is not said rather than guessed."""
    blocks = glibcheap.MAX_FREE_CHUNKS * 10 * 4 // 3  # three of every four freed, each run one chunk
    w = workload("fragment", str(blocks), "256")
    freed = int(w.proc.stdout.readline().decode().split()[1])
    parts, unread = glibcheap.anon_parts(w.pid)
    by = {p.key: p for p in parts}
    assert "allocator_in_use" not in by
    assert any("blocks in use not said" in u for u in unread)
    free = by["allocator_free"]
    assert "at least" in free.label and 0 < free.bytes < freed


JEMALLOC = Path("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")


@pytest.mark.skipif(not JEMALLOC.exists(), reason="needs libjemalloc2 (scripts/setup.sh --test installs it)")
def test_a_program_on_jemalloc_has_its_heap_unread_and_named(workload):
    """glibc's arenas hold none of what jemalloc serves: its free blocks are not said to be glibc's,
    and the split names jemalloc as not read, its memory left in the residual."""
    w = workload("fragment", env={"LD_PRELOAD": str(JEMALLOC)})
    freed = int(w.proc.stdout.readline().decode().split()[1])
    parts, unread = glibcheap.anon_parts(w.pid)
    glibc_free = next((p.bytes for p in parts if p.key == "allocator_free"), 0)
    assert glibc_free < freed // 10  # what glibc itself holds: the loader's and stdio's few blocks
    assert any(u.startswith("libjemalloc.so.2 is mapped") for u in unread), unread


def test_the_blocks_malloc_mmapped_on_their_own_are_counted_from_its_parameters(workload):
    """tests/workloads/chunks.c keeps one block of 300,000 bytes (over the mmap threshold: a mapping
    of its own) and frees another (unmapped): mp_ says one block, its pages mapped."""
    w = workload("chunks")
    for line in w.proc.stdout:
        if line.split() == [b"done"]:
            break
    stats = glibcheap.read_arena_stats(w.pid)
    assert stats is not None and stats.n_mmaps == 1
    assert 300_000 <= stats.mmapped <= 300_000 + 2 * 4096  # the block, its header, to the page
    _parts, unread = glibcheap.anon_parts(w.pid)
    assert any(u.startswith("glibc malloc: 1 block(s) of 128 KiB and more it mmapped") for u in unread), unread


def _arena(w) -> int:
    """B's address as tests/workloads/hostilearena.c prints it once it has rewritten it."""
    words = w.proc.stdout.readline().decode().split()
    assert words[0] == "arena", words
    return int(words[1])


def test_an_arena_list_that_loops_is_walked_once_per_arena(workload):
    """A thread's arena whose `next` points at itself (the list never comes back to main_arena): each
    arena is read once, the loop is said (in use not guessed), and no figure is counted twice."""
    w = workload("hostilearena", "loop")
    _arena(w)
    stats = glibcheap.read_arena_stats(w.pid)
    assert stats is not None and stats.arenas == 2  # main_arena and the thread's, each once
    assert not stats.complete and stats.in_use is None
    # what both arenas took from the system: the [heap] and the thread's one heap (HEAP_MAX at most)
    heap = next(m for m in glibcheap.read_maps(w.pid) if m.path == "[heap]")
    assert stats.system <= heap.end - heap.start + HEAP_MAX
    assert stats.top <= stats.system


def test_a_top_chunk_outside_its_heap_is_not_counted(workload):
    """A thread arena's top pointed at a fake chunk claiming 1 TiB: it lies in no heap, so neither
    its size nor its pages are counted, and the figures are said to be incomplete."""
    w = workload("hostilearena", "top")
    _arena(w)
    stats = glibcheap.read_arena_stats(w.pid)
    assert stats is not None and stats.arenas == 2
    assert stats.top < HEAP_MAX + (1 << 30) and stats.top_resident <= stats.top
    assert not stats.complete


def _read_bytes() -> int:
    """What this process has read by system calls so far (/proc/self/io's rchar)."""
    line = next(x for x in Path("/proc/self/io").read_text().splitlines() if x.startswith("rchar:"))
    return int(line.split()[1])


def test_a_large_writable_mapping_named_libc_is_not_read_whole(workload, tmp_path):
    """The target maps a 64 MiB file of its own named libc.so.99 (a copy of libc, grown), writable:
    the reader never reads it whole (before: twice, and unpacked to 8 Mi words each time), and still
    finds main_arena in the real libc's data."""
    libc = next(Path(m.path) for m in glibcheap.read_maps(os.getpid()) if glibcheap._is_libc(m) and m.is_file)
    fake = tmp_path / "libc.so.99"
    shutil.copyfile(libc, fake)
    os.truncate(fake, 64 * MiB)
    w = workload("hostilearena", "libc", str(fake))
    _arena(w)
    assert any(m.path == str(fake) and "w" in m.perms for m in glibcheap.read_maps(w.pid))
    before = _read_bytes()
    stats = glibcheap.read_arena_stats(w.pid)
    read = _read_bytes() - before
    assert read < 24 * MiB, read  # the libc banner's bounded read (16 MiB at most) and small reads
    assert stats is not None and stats.arenas >= 1 and stats.system > 0


def test_free_chunks_count_only_their_resident_pages(workload):
    """1,600 blocks of 100 KiB with only their first 4 KiB written, three of four freed: the free
    chunks span ~117 MiB of the heap but hold a few MiB of resident memory, and that is what the
    split counts (before: their size, several times the anonymous memory)."""
    count, block, touch = 1600, 100 << 10, 4096
    w = workload("fragment", str(count), str(block), str(touch))
    freed = int(w.proc.stdout.readline().decode().split()[1])
    assert freed == count * 3 // 4 * block
    split = _split(w.pid)
    free = split.value("allocator_free")
    assert free is not None and free <= split.total, (free, split.total)
    assert free >= count * 3 // 4 * touch  # the pages the program wrote before freeing them
    assert split.residual is not None and split.residual >= 0


def test_a_reader_that_fails_is_one_line_not_a_lost_report(workload, monkeypatch):
    """Whatever the target's memory makes the reader raise (here a MemoryError, as a read of a huge
    mapping once did), the split says "not read" with why, in one line, and the window closes."""
    w = workload("fragment")
    w.proc.stdout.readline()

    def fails(pid: int):
        raise MemoryError("a hostile mapping")

    monkeypatch.setattr(glibcheap, "read_arena_stats", fails)
    split = _split(w.pid)
    assert not [p for p in split.parts if p.key.startswith("allocator_")]
    said = [u for u in split.unread if "not read" in u and "MemoryError: a hostile mapping" in u]
    assert len(said) == 1 and "\n" not in said[0], split.unread
    assert split.residual == split.total
