"""Naming the culprit: the first frame past allocators, wrappers and runtime code, by the
playbook's `wrappers:` list (strict data, extended by a site's files) and the forwarding guess."""

from pathlib import Path

import pytest
from memdiag.diagnose.culprit import Classes, default_classes, split_frame
from memdiag.diagnose.factset import app_function
from memdiag.rules.loader import RuleFileError, load_playbook, shipped_playbooks

LIBC, STDCXX = "[libc.so.6]", "[libstdc++.so.6.0.30]"


def _name(frames: list[str], forwards: list[bool] | None = None, classes: Classes | None = None):
    return (classes or default_classes()).name(frames, forwards)


def test_the_caller_of_a_listed_wrapper_is_named_and_every_frame_marked():
    n = _name([f"malloc+0x0 {LIBC}", "xmalloc+0x9 [orderd]", "process_order+0x14 [orderd]", "main+0x67 [orderd]"])
    assert n.function == "process_order" and n.index == 2 and not n.guessed
    assert n.kinds == ["allocator", "wrapper", "culprit", "caller"]


def test_operator_new_and_std_templates_are_passed_over():
    n = _name(
        [
            f"malloc+0x0 {LIBC}",
            f"operator new(unsigned long)+0x1c {STDCXX}",
            "void std::vector<Entry*, std::allocator<Entry*> >::_M_realloc_insert<Entry* const&>"
            "(__gnu_cxx::__normal_iterator<Entry**, std::vector<Entry*, std::allocator<Entry*> > >, Entry* const&)"
            "+0x116 [cxxpaths]",
            "append(long)+0xa9 [cxxpaths]",
        ]
    )
    assert n.function == "append(long)"
    assert n.kinds == ["allocator", "allocator", "runtime", "culprit"]
    # a function that only takes a std type as argument is the program's own
    assert _name([f"malloc+0x0 {LIBC}", "parse(std::string const&)+0x10 [app]"]).function == "parse(std::string const&)"


def test_redis_zmalloc_under_jemalloc_names_its_caller():
    n = _name(
        ["malloc+0x0 [libjemalloc.so.2]", "zmalloc_usable+0x2a [redis-server]", "_sdsnewlen+0x17c [redis-server]"]
    )
    assert n.function == "_sdsnewlen" and n.kinds[:2] == ["allocator", "wrapper"]


def test_a_go_heap_mapped_through_cgo_names_the_go_code_past_the_runtime():
    """Every Debian Go binary importing net is a cgo one: the runtime maps its heap through its own
    C glue (x_cgo_mmap), which was named the culprit."""
    n = _name(
        [
            f"mmap64+0x0 {LIBC}",
            "x_cgo_mmap+0x26 [sessiond]",
            "runtime.callCgoMmap+0x40 [sessiond]",
            "runtime.sysMap+0x2b [sessiond]",
            "runtime.(*mheap).grow+0xd1 [sessiond]",
            "runtime.mallocgc+0x4ab [sessiond]",
            "runtime.mapassign_faststr+0x2f0 [sessiond]",
            "main.rememberSession+0x9c [sessiond]",
            "main.main+0x40 [sessiond]",
        ]
    )
    assert n.function == "main.rememberSession"
    assert n.kinds[:2] == ["allocator", "runtime"] and n.kinds[-2:] == ["culprit", "caller"]
    glue = _name([f"malloc+0x0 {LIBC}", "_cgo_0b49d6ed4a0b_Cfunc_malloc+0x1c [app]", "main.fill+0x55 [app]"])
    assert glue.function == "main.fill"


def test_interpreter_frames_are_named_and_marked():
    n = _name(
        [
            f"malloc+0x0 {LIBC}",
            "_PyObject_Malloc+0x10 [python3.11]",
            "PyByteArray_Resize+0x99 [python3.11]",
            "_PyEval_EvalFrameDefault+0x189d [python3.11]",
        ]
    )
    assert n.function == "PyByteArray_Resize" and n.interpreter
    assert n.kinds == ["allocator", "wrapper", "interpreter", "caller"]
    # what the verdict quotes says it is the interpreter's, not the program's (an unsupported CPython)
    assert n.label == "PyByteArray_Resize (the interpreter's own; the script calling it unread)"


PY = "[python3.11]"


JVM = [
    f"malloc (malloc.c:3281) {LIBC}",
    "os::malloc(unsigned long, MEMFLAGS)+0x85 [libjvm.so]",
    "Unsafe_AllocateMemory0+0x7c [libjvm.so]",
    "jdk.internal.misc.Unsafe.allocateMemory0(long) (JIT code) [perf-4242.map]",
    "jdk.internal.misc.Unsafe.allocateMemory(long) (JIT code) [perf-4242.map]",
]


def test_a_jvm_s_native_allocation_is_named_by_the_program_s_jit_compiled_method():
    """The JVM's own frames (libjvm.so, the JDK's classes, HotSpot's stubs) are passed over where the
    program's JIT-compiled method is above them; without one the JVM's frame is named, as before; a
    method the interpreter runs is named as that, not blamed on its caller."""
    above = ["Thumbnails.thumbnail(int, int) (JIT code) [perf-4242.map]", "StubRoutines (1) (JIT code) [perf-4242.map]"]
    n = _name(JVM + above)
    assert (n.function, n.index) == ("Thumbnails.thumbnail(int, int)", 5)
    assert n.kinds == ["allocator", "interpreter", "interpreter", "runtime", "runtime", "culprit", "caller"]
    # frame pointers lost in compiled code: only the JDK's frames above, the JVM's frame named
    n = _name(JVM)
    assert n.function == "os::malloc(unsigned long, MEMFLAGS)" and n.kinds[1] == "interpreter"
    interpreted = [
        "Interpreter (JIT code) [perf-4242.map]",
        "Thumbnails.main(java.lang.String[]) (JIT code) [perf-4242.map]",
    ]
    n = _name(JVM + interpreted)
    assert n.function == "Interpreter" and n.index == 5 and "interpreter ran" in n.label


def test_with_the_python_frames_the_interpreter_is_passed_over_and_the_python_line_named():
    n = _name(
        [
            f"malloc+0x0 {LIBC}",
            f"_PyObject_Malloc+0x10 {PY}",
            f"PyByteArray_FromStringAndSize+0x99 {PY}",
            "handle_order (/srv/app/orders.py:42) [python]",
            "main (/srv/app/orders.py:60) [python]",
        ]
    )
    assert n.function == "handle_order (orders.py:42)" and not n.interpreter
    assert n.kinds == ["allocator", "wrapper", "interpreter", "culprit", "caller"]
    assert split_frame("handle_order (/srv/app/orders.py:42) [python]") == ("handle_order (orders.py:42)", "python")
    assert split_frame("[unknown] [python]") == (None, "python")
    # the standard library and frames whose code could not be read are passed over
    n = _name(
        [
            f"malloc+0x0 {LIBC}",
            f"PyUnicode_New+0x1 {PY}",
            "JSONEncoder.encode (/usr/lib/python3.11/json/encoder.py:200) [python stdlib]",
            "[unknown] [python]",
            "Report.write (/srv/app/report.py:3) [python]",
        ]
    )
    assert n.function == "Report.write (report.py:3)"
    assert n.kinds == ["allocator", "interpreter", "runtime", "unknown", "culprit"]
    # a C name's glob never claims a Python function: xmalloc_buffer() is the program's own
    assert _name([f"malloc+0x0 {LIBC}", "xmalloc_buffer (/a/b.py:1) [python]"]).function == "xmalloc_buffer (b.py:1)"


def test_a_native_culprit_called_through_ctypes_is_named_with_its_python_caller():
    n = _name(
        [
            f"malloc+0x0 {LIBC}",
            "take_record+0x1a [libdrop.so]",
            "[unknown] [libffi.so.8.1.2]",
            "_ctypes_callproc+0x2a4 [_ctypes.cpython-311-x86_64-linux-gnu.so]",
            f"_PyObject_MakeTpCall+0x87 {PY}",
            "process_batch (/srv/job/batch.py:21) [python]",
        ]
    )
    assert n.function == "take_record" and n.python_caller == "process_batch (batch.py:21)"
    assert n.label == "take_record, called from Python process_batch (batch.py:21)"
    assert n.kinds[:2] == ["allocator", "culprit"]


def test_a_guessed_wrapper_is_passed_over_only_right_above_the_allocator():
    frames = [f"malloc+0x0 {LIBC}", "ticket_alloc+0x9 [app]", "take_ticket+0x16 [app]", "main+0x86 [app]"]
    n = _name(frames, [False, True, False, True])
    assert n.function == "take_ticket" and n.guessed
    assert n.kinds == ["allocator", "guessed-wrapper", "culprit", "caller"]
    # main also reads as forwarding, but its callee was named: it is never looked at
    assert _name(frames, [False, False, False, True]).function == "ticket_alloc"
    # forwarding code with no allocator below it is the culprit itself
    assert _name(["leaf+0x1 [app]", "caller+0x2 [app]"], [True, True]).function == "leaf"


def test_unknown_frames_are_passed_over_and_split():
    assert split_frame("[unknown] [python3.11]") == (None, "python3.11")
    assert split_frame("f(int)+0x1a [a b]") == ("f(int)", "a b")
    assert app_function([f"malloc+0x0 {LIBC}", "[unknown]", "handler+0x3 [app]"]) == "handler"
    assert (
        app_function([f"malloc+0x0 {LIBC}", "[unknown] [python3.11]", "list_resize+0x3 [python3.11]"])
        == "list_resize (the interpreter's own; the script calling it unread)"
    )
    # an unnamed frame of the program itself is the culprit, said so, never its caller
    n = _name([f"malloc+0x0 {LIBC}", "[unknown] [app]", "handler+0x3 [app]"])
    assert n.function is None and n.index == 1 and n.label == "an unnamed function in app (no symbol)"
    assert app_function([f"malloc+0x0 {LIBC}", f"__libc_start_main+0x1 {LIBC}"]) is None
    # jemalloc's internals have no symbols, but their module says what they are
    n = _name(["mmap64+0x0 [libc.so.6]", "[unknown] [libjemalloc.so.2]", "zmalloc+0x29 [redis]", "dictAdd+0x5 [redis]"])
    assert n.kinds == ["allocator", "allocator", "wrapper", "culprit"] and n.function == "dictAdd"


def _file(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_site_file_adds_wrappers_to_the_shipped_list(tmp_path):
    site = _file(tmp_path, 'wrappers:\n  - {function: "order_pool_get*", kind: wrapper, note: "our pool"}\n')
    book = load_playbook([*shipped_playbooks(), site])
    assert book.wrappers[-1].function == "order_pool_get*" and book.wrappers[-1].source == f"{site}:2"
    assert len(book.wrappers) == len(default_classes().by_function) + len(default_classes().by_module) + 1
    n = _name(
        [f"malloc+0x0 {LIBC}", "order_pool_get_slot+0x9 [orderd]", "take+0x1 [orderd]"], classes=Classes(book.wrappers)
    )
    assert n.function == "take"
    assert _name([f"malloc+0x0 {LIBC}", "order_pool_get_slot+0x9 [orderd]"]).function == "order_pool_get_slot"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "wrappers:\n  - {function: x, kind: wrapper}\n  - {function: y, kind: wraper}\n",
            ":3: wrappers entry 2 kind: Input should be",
        ),
        ("wrappers:\n  - {function: x, kind: wrapper, why: z}\n", ":2: wrappers entry 1: unknown key `why`"),
        ("wrappers:\n  - {kind: runtime}\n", ":2: wrappers entry 1: a wrappers entry needs `function` or `module`"),
        ("wrapers:\n  - {function: x, kind: wrapper}\n", ":1: a playbook is a mapping with `rules`"),
    ],
)
def test_wrapper_entries_are_checked_strictly_with_file_and_line(tmp_path, text, message):
    with pytest.raises(RuleFileError) as e:
        load_playbook([_file(tmp_path, text)])
    assert any(message in err for err in e.value.errors), e.value.errors


def test_rules_list_shows_each_wrapper_and_where_it_comes_from(tmp_path, capsys, monkeypatch):
    from memdiag.diagnose.cli import main

    monkeypatch.chdir(tmp_path)  # no ./playbooks here
    site = _file(tmp_path, 'wrappers:\n  - {function: "pool_get*", module: "orderd", kind: wrapper, note: "ours"}\n')
    assert main(["rules", "list", str(site), "--wrappers"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("allocator    function malloc") and out[0].endswith("wrappers.yaml:15")
    assert out[-1].split() == ["wrapper", "function", "pool_get*", "in", "module", "orderd", f"{site}:2", "(ours)"]
    assert main(["rules", "check", str(site)]) == 0
    assert capsys.readouterr().out == "ok: 0 rules and 1 wrappers in 1 file(s)\n"
