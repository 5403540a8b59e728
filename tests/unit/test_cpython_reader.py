"""The CPython reader on the real interpreter (Debian's /usr/bin/python3.11, always installed): the
location-table decoder agrees with CPython's own co_lines() on the standard library's code, a
running child is located with its exact version and layout, its code objects are read back by
name, file and line and anything else is refused, its holders are named by the global, and a
layout it cannot know is refused by version. A child of the test is read through /proc/PID/mem
as the same user: no root needed."""

from __future__ import annotations

import struct
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from memdiag.probes.cpython import layout
from memdiag.probes.cpython.code import Codes, line_at
from memdiag.probes.cpython.holder import Holders
from memdiag.probes.cpython.memory import Memory
from memdiag.probes.cpython.target import locate
from memdiag.probes.procmaps import AddressSpace

PYTHON = "/usr/bin/python3.11"
FIELDS = ("pid", "hexversion", "code", "first", "bytearray", "buffer", "bytes", "failed")
CHILD = """
import ctypes, os, sys
failed = []
by_id = {}
def handle_order(i):
    payload = bytearray(16384)
    failed.append(payload)
    by_id[i] = b"x" * 20000
def report():
    ba = failed[7]
    buf = ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))
    code = handle_order.__code__
    print(os.getpid(), sys.hexversion, id(code), code.co_firstlineno, id(ba), buf, id(by_id[3]), id(failed), flush=True)
for i in range(40):
    handle_order(i)
report()
sys.stdin.read()
"""


def _code_objects(module: types.ModuleType):
    todo = [v.__code__ for v in vars(module).values() if isinstance(v, types.FunctionType)]
    while todo:
        co = todo.pop()
        yield co
        todo += [c for c in co.co_consts if isinstance(c, types.CodeType)]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="the location table is 3.11's")
def test_location_table_lines_match_co_lines_on_the_standard_library():
    import argparse
    import asyncio.base_events
    import email.message
    import json.decoder
    import typing

    checked = 0
    for module in (json.decoder, asyncio.base_events, email.message, argparse, typing):
        for co in _code_objects(module):
            for start, end, line in co.co_lines():
                for unit in range(start // 2, end // 2):
                    assert line_at(co.co_linetable, co.co_firstlineno, unit) == line, (co.co_qualname, unit)
                    checked += 1
    assert checked > 10000


@pytest.fixture
def child():
    proc = subprocess.Popen([PYTHON, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        fields = [int(x) for x in proc.stdout.readline().split()]
        yield proc, dict(zip(FIELDS, fields, strict=True))
    finally:
        proc.kill()
        proc.wait()


def test_a_running_interpreter_is_located_with_its_version_and_read_by_its_layout(child):
    _proc, seen = child
    pid = seen["pid"]
    with Memory(pid) as mem:
        found, why = locate(pid, AddressSpace.of(pid), mem)
        assert found is not None, why
        assert found.version == layout.describe_version(seen["hexversion"])
        assert found.layout.version == (3, 11) and found.layout.source == "table"
        assert found.module == str(Path(PYTHON).resolve()) and found.stdlib == "/usr/lib/python3.11"
        codes = Codes(found, mem)
        code = codes.code(seen["code"])
        assert code is not None
        assert (code.qualname, code.filename, code.firstlineno) == ("handle_order", "<string>", seen["first"])
        # the first instruction of a function is at its def line; a non-code object is no code
        assert code.line(found.layout.code_adaptive, seen["code"] + found.layout.code_adaptive) == seen["first"]
        assert codes.code(seen["bytearray"]) is None and codes.code(seen["code"] + 8) is None
        assert codes.invalid == 2
        assert mem.reads > 0 and mem.bytes > 0  # what naming cost is counted


def test_a_held_block_is_named_by_the_global_that_holds_it(child):
    _proc, seen = child
    pid = seen["pid"]
    with Memory(pid) as mem:
        found, _why = locate(pid, AddressSpace.of(pid), mem)
        holders = Holders(found, mem)
        # the bytearray's buffer is pointed at from the bytearray (a small object in a pool)
        assert holders.object_at(seen["bytearray"] + 32) == seen["bytearray"]
        assert holders.name(seen["bytearray"] + 32, seen["buffer"]) == "`__main__.failed` (a list)"
        # a bytes object is its own block, held by a dict's value
        assert holders.name(0, seen["bytes"]) == "`__main__.by_id` (a dict)"
        assert holders.type_of(seen["failed"])[0] == "list"
        assert holders.name(seen["buffer"] + 64, seen["buffer"] + 64) is None  # inside a buffer: no object


def test_an_unknown_version_is_refused_by_name_never_read():
    offsets = bytearray(layout.DEBUG_OFFSETS_BYTES)
    offsets[:8] = layout.DEBUG_COOKIE
    struct.pack_into("<Q", offsets, 8, 0x030E00F0)  # 3.14.0
    refused = (None, "unsupported version 3.14.0 (its _Py_DebugOffsets is not read)")
    assert layout.from_debug_offsets(bytes(offsets)) == refused
    struct.pack_into("<QQ", offsets, 8, 0x030D00F0, 1)  # 3.13.0, free-threaded
    assert layout.from_debug_offsets(bytes(offsets))[1] == "unsupported build: free-threaded CPython 3.13.0"
    assert layout.from_debug_offsets(b"\0" * layout.DEBUG_OFFSETS_BYTES)[0] is None
    struct.pack_into("<QQ", offsets, 8, 0x030D00F0, 0)
    got, why = layout.from_debug_offsets(bytes(offsets))
    assert got is not None and got.version == (3, 13) and got.source == "_Py_DebugOffsets" and why == ""
    assert layout.TABLES[(3, 11)].frame_fields_fit() and layout.TABLES[(3, 12)].frame_fields_fit()


def test_the_deepest_python_stack_is_read_to_price_the_walk():
    from memdiag.probes.cpython.price import deepest_stack

    code = (
        "import os, sys\n"
        "def down(n):\n    return sys.stdin.read() if n == 0 else down(n - 1)\n"
        "print(os.getpid(), flush=True)\ndown(20)\n"
    )
    proc = subprocess.Popen([PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        with Memory(pid) as mem:
            found, why = locate(pid, AddressSpace.of(pid), mem)
            assert found is not None, why
            deadline = time.monotonic() + 10
            while deepest_stack(found, mem) != 22 and time.monotonic() < deadline:  # <module> + 21 down()
                time.sleep(0.05)  # until it sits in the innermost call
            assert deepest_stack(found, mem) == 22
    finally:
        proc.kill()
        proc.wait()


HOLDERS = """
import ctypes, os, sys
class Retry:
    queue = []  # the class's own list
TAC = '''
kept = []
def handle_order(i):
    kept.append(bytearray(16384))
'''
def load():  # as twistd -y runs a .tac: exec()'d in a dict, never a module, held by what it made
    ns = {"__file__": "/srv/orders.tac"}
    exec(compile(TAC, "/srv/orders.tac", "exec"), ns)
    return ns["handle_order"]
handle = load()
def buffer(ba):
    return ctypes.addressof((ctypes.c_char * len(ba)).from_buffer(ba))
for i in range(40):
    Retry.queue.append(bytearray(16384))
    handle(i)
def show():  # the two bytearrays held only by their lists: no global of their own
    ns = handle.__globals__
    q, k = Retry.queue[7], ns["kept"][7]
    print(os.getpid(), id(q), buffer(q), id(k), buffer(k), id(ns), id(globals()), flush=True)
show()
sys.stdin.read()
"""


def test_a_class_attribute_and_a_global_of_code_exec_ran_are_named_as_holders():
    """A class's own list is `module.Class.attribute`; a namespace exec() ran code in (twistd's .tac)
    is named where the walk recorded a frame running with it, by what it ran, never otherwise."""
    proc = subprocess.Popen([PYTHON, "-c", HOLDERS], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pid, q, q_buf, k, k_buf, ns, main = (int(x) for x in proc.stdout.readline().split())
        with Memory(pid) as mem:
            found, why = locate(pid, AddressSpace.of(pid), mem)
            assert found is not None, why
            lay = found.layout
            # the main thread's frame (<module>, in sys.stdin.read()) runs with __main__'s globals:
            # the offset the BPF walk reads f_globals at
            interp = mem.u64(found.interpreters_head)
            tstate = mem.u64(interp + lay.interp_threads_head)
            frame = mem.u64(tstate + lay.tstate_frame)
            frame = mem.u64(frame + lay.cframe_current_frame) if lay.cframe_current_frame is not None else frame
            assert mem.u64(frame + lay.frame_globals) == main
            modules_only = Holders(found, mem)
            assert modules_only.name(q + 32, q_buf) == "`__main__.Retry.queue` (a list)"
            assert modules_only.name(k + 32, k_buf) is None  # no module holds the namespace
            with_frames = Holders(found, mem, frame_globals={ns: "/srv/orders.tac", main: "<string>"})
            assert with_frames.name(k + 32, k_buf) == "`kept` (a list, a global of orders.tac run by exec())"
            assert with_frames.name(q + 32, q_buf) == "`__main__.Retry.queue` (a list)"  # a module's: as before
    finally:
        proc.kill()
        proc.wait()


BIG = """
import sys
seen = [(f"req-{i}", i / 7) for i in range(1_200_000)]  # more items than one container's index keeps
print(id(seen), id(seen[-1]), flush=True)
sys.stdin.read()
"""


def test_a_list_of_more_items_than_the_index_keeps_still_names_its_objects():
    """A service's list of millions: indexed by a sample of its items (before: not at all, and every
    arena of its objects named nothing), its item array kept as a range whole."""
    from memdiag.probes.cpython import holder

    assert holder.MAX_ITEMS < 1_200_000
    proc = subprocess.Popen([PYTHON, "-c", BIG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        listed, last = (int(x) for x in proc.stdout.readline().split())
        with Memory(proc.pid) as mem:
            found, why = locate(proc.pid, AddressSpace.of(proc.pid), mem)
            assert found is not None, why
            holders = Holders(found, mem)
            arena = last & ~((1 << 20) - 1)  # the 1 MiB arena the newest tuple lies in (pymalloc's)
            assert holders.name(0, arena, 1 << 20) == "`__main__.seen` (a list)"
            items = mem.u64(listed + found.layout.list_items)
            assert holders.name(items + 8 * 1_199_999, items) == "`__main__.seen` (a list)"  # its last slot
    finally:
        proc.kill()
        proc.wait()
