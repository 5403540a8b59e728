"""The rbp chain walked in a stack copy where call-frame rules end (V8's builtins and JIT frames
keep frame pointers but have no .eh_frame): each step's rbp above the last, its return address code."""

import struct

from memdiag.probes.unwind import StackSlice, frame_pointer_walk

BASE = 0x7FFF_0000_0000
CODE = range(0x1000, 0x2000)


def _stack(frames: list[tuple[int, int, int]], size: int = 512) -> StackSlice:
    """(offset of a frame's rbp slot, the caller's rbp, the return address) written into a copy."""
    data = bytearray(size)
    for at, caller_bp, ra in frames:
        struct.pack_into("<QQ", data, at, caller_bp, ra)
    return StackSlice(BASE, bytes(data))


def test_the_chain_is_walked_up_to_the_first_return_address_that_is_not_code():
    s = _stack([(0x40, BASE + 0x80, 0x1100), (0x80, BASE + 0xC0, 0x1200), (0xC0, BASE + 0x100, 0x9999)])
    assert frame_pointer_walk(BASE + 0x40, BASE + 0x20, s, lambda a: a in CODE) == [0x1100, 0x1200]


def test_an_rbp_below_the_frame_a_misaligned_one_or_one_outside_the_copy_stops_it():
    looping = _stack([(0x40, BASE + 0x80, 0x1100), (0x80, BASE + 0x40, 0x1200)])  # points back down
    assert frame_pointer_walk(BASE + 0x40, BASE, looping, lambda a: a in CODE) == [0x1100, 0x1200]
    assert frame_pointer_walk(BASE + 0x40, BASE + 0x48, looping, lambda a: a in CODE) == []  # under its sp
    assert frame_pointer_walk(BASE + 0x44, BASE, looping, lambda a: a in CODE) == []  # not 8-aligned
    assert frame_pointer_walk(BASE + 0x4000, BASE, looping, lambda a: a in CODE) == []  # past the copy
    assert frame_pointer_walk(None, BASE, looping, lambda a: a in CODE) == []
