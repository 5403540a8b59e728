"""jemalloc's base blocks (its records of every extent) are recognised by their own header and kept
out of the roots; words that only look like one are not. On a synthetic image of the target's memory
(a file read at the addresses the regions give, as /proc/PID/mem is). CPython's arena records
(pymalloc's arena_object) are matched in the words being scanned, on a CPython target only."""

import os
import struct

from memdiag.probes.mapping import Mapping
from memdiag.probes.memleak.reach import allocmeta
from memdiag.probes.memleak.reach.model import TIER_STATIC, TIER_UNTRACKED
from memdiag.probes.memleak.reach.regions import Region

MiB = 1 << 20
BASE = 0x7F0000000000  # where the synthetic mapping starts (2 MiB aligned)


def _image(tmp_path, headers: dict[int, tuple]) -> int:
    """A sparse file standing for 16 MiB of anonymous memory at BASE; headers: offset -> five words."""
    path = tmp_path / "mem"
    with open(path, "wb") as f:
        f.truncate(16 * MiB)
        for off, words in headers.items():
            f.seek(off)
            f.write(struct.pack("<5Q", *words))
    return os.open(path, os.O_RDONLY)


def _find(fd, regions, allocator="jemalloc"):
    return allocmeta.find(lambda at, n: os.pread(fd, n, at - BASE), regions, allocator)  # the file from BASE up


def _anon(start=BASE, end=BASE + 16 * MiB, tier=TIER_UNTRACKED):
    return Region(start, end, tier, Mapping(start, end, "rw-p", 0, ""))


def test_a_base_block_is_found_by_its_header_and_carved_out(tmp_path):
    a = BASE + 2 * MiB
    fd = _image(tmp_path, {2 * MiB: (2 * MiB, 0, 0xE80AFFF, a + 0xBC580, 2 * MiB - 0xBC580)})
    meta = _find(fd, [_anon()])
    assert meta.ranges == ((a, a + 2 * MiB),) and meta.bytes == 2 * MiB
    assert "jemalloc's base block" in meta.what
    left = allocmeta.carve([_anon()], meta)
    assert [(r.start, r.end) for r in left] == [(BASE, a), (a + 2 * MiB, BASE + 16 * MiB)]
    assert all(r.tier == TIER_UNTRACKED for r in left)


def test_words_that_only_look_like_a_header_are_kept_as_roots(tmp_path):
    a = BASE + 2 * MiB
    bad = {
        0: (2 * MiB, 0, 0, BASE + 0x100, 2 * MiB - 0x100 + 8),  # the tail does not end at the block's end
        2 * MiB: (3 * MiB, 0, 0, a + 0x100, 3 * MiB - 0x100),  # not a multiple of 2 MiB
        4 * MiB: (2 * MiB, BASE + 12345, 0, BASE + 4 * MiB + 0x100, 2 * MiB - 0x100),  # next not aligned
        6 * MiB: (2 * MiB, 0, 0, BASE + 9 * MiB, 0),  # its free tail outside itself
        14 * MiB: (4 * MiB, 0, 0, BASE + 14 * MiB + 0x100, 4 * MiB - 0x100),  # past the mapping's end
    }
    fd = _image(tmp_path, bad)
    assert _find(fd, [_anon()]).ranges == ()


def test_only_under_jemalloc_and_only_in_untracked_anonymous_memory(tmp_path):
    a = BASE + 2 * MiB
    fd = _image(tmp_path, {2 * MiB: (2 * MiB, 0, 0, a + 0x1000, 2 * MiB - 0x1000)})
    assert _find(fd, [_anon()], allocator="glibc").ranges == ()
    assert _find(fd, [_anon(tier=TIER_STATIC)]).ranges == ()
    assert _find(fd, [_anon()]).ranges == ((a, a + 2 * MiB),)


def _matcher(pymalloc: bool):
    import numpy as np
    from memdiag.probes.memleak.reach.match import Matcher
    from memdiag.probes.memleak.reach.model import Blocks

    starts = np.array([BASE + 0x2000, BASE + 0x102000], dtype=np.uint64)  # two 1 MiB arenas, page- not pool-aligned
    sizes = np.array([MiB, MiB], dtype=np.uint64)
    return Matcher(Blocks(starts, sizes, np.zeros(2, dtype=np.int64)), pymalloc)


def test_pymalloc_arena_records_are_no_references_and_what_only_resembles_one_is():
    import numpy as np

    a, b = BASE + 0x2000, BASE + 0x102000
    words = np.array(
        [
            # obmalloc.c's arena_object for a: address, pool_address (first 16 KiB boundary up, a
            # full arena carved to its end), nfreepools 2 | ntotalpools 63 << 32, freepools, next, prev
            a,
            a + 0xFE000,
            63 << 32 | 2,
            a + 0x8000,
            BASE + 0x300000,
            0,
            # a list's item array: objects inside b, never its first byte
            b + 0x4030,
            b + 0x4070,
            # b's first byte followed by what no record holds: a pool address off a page, then too many pools
            b,
            b + 0x10,
            63 << 32,
            0,
            b,
            b + 0x4000,
            300 << 32,
            0,
            b,
            b + 0x4000,
            2 << 32 | 5,
            0,  # more free pools than pools
        ],
        dtype=np.uint64,
    )
    pos, dst = _matcher(True).hits(words)
    assert pos.tolist() == [6, 7, 8, 9, 12, 13, 16, 17] and dst.tolist() == [1] * 8
    # on any other target the same words are all references: a C program's own region records look so
    pos, _ = _matcher(False).hits(words)
    assert pos.tolist() == [0, 1, 3, 6, 7, 8, 9, 12, 13, 16, 17]
