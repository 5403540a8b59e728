"""The Python frames the walk recorded, mixed into a native stack: each eval-loop call becomes
the Python frames it ran (up to the one marked last in its call), frames no native frame
accounts for follow the native ones, and stacks of one Python call path through the interpreter
merge while a C library's own stay apart."""

from memdiag.probes.cpython.frames import PyFrame, PythonStacks, mixed

EVAL = "_PyEval_EvalFrameDefault+0x1c2 [python3.11]"


def _py(name: str, line: int, last: bool = False) -> PyFrame:
    return PyFrame(qualname=name, filename="/srv/app.py", line=line, last_in_call=last)


def test_each_eval_loop_call_is_the_python_frames_it_ran():
    native = ["malloc+0x0 [libc.so.6]", "PyList_Append+0x9 [python3.11]", EVAL, "PyObject_Call+0x3 [python3.11]", EVAL]
    functions = ["malloc", "PyList_Append", "_PyEval_EvalFrameDefault", "PyObject_Call", "_PyEval_EvalFrameDefault"]
    python = [_py("inner", 3), _py("callback", 9, last=True), _py("main", 20), _py("<module>", 30, last=True)]
    frames, names = mixed(native, functions, python)
    assert frames == [
        "malloc+0x0 [libc.so.6]",
        "PyList_Append+0x9 [python3.11]",
        "inner (/srv/app.py:3) [python]",
        "callback (/srv/app.py:9) [python]",
        "PyObject_Call+0x3 [python3.11]",
        "main (/srv/app.py:20) [python]",
        "<module> (/srv/app.py:30) [python]",
    ]
    assert names[2:4] == ["inner (app.py:3)", "callback (app.py:9)"]
    # the native unwind stopped short of the eval loop: the Python frames follow, outermost last
    frames, _ = mixed(native[:2], functions[:2], python[:2])
    assert frames[2:] == ["inner (/srv/app.py:3) [python]", "callback (/srv/app.py:9) [python]"]
    # a frame whose code could not be read stays a frame, unknown, never dropped or guessed
    assert str(PyFrame(qualname=None)) == "[unknown] [python]"
    assert PyFrame(qualname="f", filename="/usr/lib/python3.11/json/encoder.py", line=2, stdlib=True).module == (
        "python stdlib"
    )


def test_one_python_call_path_through_the_interpreter_is_one_stack():
    stacks = PythonStacks()
    python = ["remember (/srv/app.py:16) [python]", "main (/srv/app.py:25) [python]"]
    tuple_arena = ["mmap64+0x0 [libc.so.6]", "[unknown] [python3.11]", "PyTuple_New+0x1 [python3.11]", *python]
    str_arena = ["mmap64+0x0 [libc.so.6]", "[unknown] [python3.11]", "PyUnicode_New+0x2 [python3.11]", *python]
    # no CPython registered for the pid: stacks keep their whole frames
    assert stacks.group(7, tuple_arena) != stacks.group(7, str_arena)
    from memdiag.probes.cpython import frames as module

    class _Proc:
        module = "/usr/bin/python3.11"

    stacks.targets[7] = module._Target(proc=_Proc(), memory=None, codes=None)  # type: ignore[arg-type]
    assert stacks.group(7, tuple_arena) == stacks.group(7, str_arena)
    malloc = ["malloc+0x0 [libc.so.6]", "[unknown] [python3.11]", *python]
    assert stacks.group(7, malloc, by_entry=True) != stacks.group(7, tuple_arena, by_entry=True)  # memleak's
    assert stacks.group(7, malloc) == stacks.group(7, tuple_arena)  # page faults of one line at two places
    ctypes = ["malloc+0x0 [libc.so.6]", "take_record+0xf [libdrop.so]", "ffi_call+0x1 [libffi.so.8]", *python]
    assert stacks.group(7, ctypes) == tuple(ctypes)  # a C library's own allocation stays its own


def test_what_the_reader_of_python_frames_should_know_is_said():
    from memdiag.probes.cpython.frames import PythonReading, caveats

    assert caveats(None) == []
    reading = PythonReading(
        refused={9: "unsupported version 3.10"},
        stacks=3,
        truncated=1,
        unreadable=2,
        max_frames=32,
        arena_stacks=1,
        memory_reads=1234,
        memory_bytes=2 << 20,
        memory_s=0.021,
    )
    said = caveats(reading)
    assert said[0] == "PID 9: its Python frames were not read: unsupported version 3.10"
    assert "deeper than the 32 frames" in said[1] and "2 Python frames are [unknown]" in said[2]
    assert said[3].startswith("To name Python frames and holders memdiag read 2.0 MiB of the target's memory in 1,234")
    assert "pymalloc's 1 MiB arenas" in said[4]
    assert not any("arenas" in c for c in caveats(reading.model_copy(update={"arena_stacks": 0})))


def test_memdiag_probe_says_what_was_read_of_which_process():
    from memdiag.probes.cpython.frames import PythonReading, reading_lines

    reading = PythonReading(
        read={5: "CPython 3.11.2 (python3.11, layout from its table)"}, refused={6: "unsupported version 3.10"}
    )
    lines = reading_lines(reading.model_copy(update={"stacks": 4, "memory_reads": 26, "memory_bytes": 1600}))
    assert lines[0] == "  python: PID 5: CPython 3.11.2 (python3.11, layout from its table)"
    assert lines[1] == "  python: PID 6: not read: unsupported version 3.10"
    assert lines[2].startswith("    4 stacks with Python frames; 26 reads (1.6 KiB) of its memory in")


def test_pymalloc_arenas_mapped_by_any_python_line_are_one_stack_for_memleak():
    """An arena is mapped by whichever line found the last one full, no sample of the lines that
    fill it: memleak's arenas are one stack (their trend the interpreter's), page faults' stay apart
    by line, and a thread's stack (mapped by the C library's pthread_create) is no arena."""
    from memdiag.probes.cpython import frames as module

    class _Proc:
        module = "/usr/bin/python3.11"

    stacks = PythonStacks()
    stacks.targets[7] = module._Target(proc=_Proc(), memory=None, codes=None)  # type: ignore[arg-type]
    counter = ["mmap64+0x0 [libc.so.6]", "[unknown] [python3.11]", "PyObject_Malloc+0xab [python3.11]",
               "main (/srv/app.py:22) [python]", "<module> (/srv/app.py:26) [python]"]  # fmt: skip
    keeper = ["mmap64+0x0 [libc.so.6]", "[unknown] [python3.11]", "_PyObject_GC_New+0x17c [python3.11]",
              "record (/srv/app.py:12) [python]", "main (/srv/app.py:21) [python]"]  # fmt: skip
    one = stacks.group(7, counter, by_entry=True)
    assert one == stacks.group(7, keeper, by_entry=True) and PythonStacks.is_arenas(one)
    assert stacks.group(7, counter) != stacks.group(7, keeper)  # page faults name each line apart
    thread = ["mmap64+0x0 [libc.so.6]", "pthread_create+0x1 [libc.so.6]", "[unknown] [python3.11]",
              "start (/usr/lib/python3.11/threading.py:957) [python stdlib]"]  # fmt: skip
    assert not PythonStacks.is_arenas(stacks.group(7, thread, by_entry=True))
    malloc = ["malloc+0x0 [libc.so.6]", "[unknown] [python3.11]", "record (/srv/app.py:12) [python]"]
    assert not PythonStacks.is_arenas(stacks.group(7, malloc, by_entry=True))
