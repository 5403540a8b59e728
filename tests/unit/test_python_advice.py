"""Where memdiag reads a CPython target's frames, its next steps name the Python function and
never send the user to a Python profiler; where it cannot (a version without a known layout), the
finding says why and the steps give the Python tools, with the pid and command line. The shipped
playbook decides both, over the fact target.python_frames."""

from memdiag.rules.engine import advice_of, run_rules
from memdiag.rules.loader import load_playbooks, shipped_playbooks

RULES = load_playbooks(shipped_playbooks())
TARGET = {
    "target.kind": "pid",
    "target.name": "PID 42 (python3)",
    "target.pid": "42",
    "target.command": "/usr/bin/python3 orders.py",
    "target.runtime": "cpython",
    "target.runtime_detail": "CPython 3.11 (/usr/bin/python3.11)",
}
LEAK = {"reach.scanned": True, "reach.leaked_count": 600, "reach.leaked_ratio": 100.0}


def _fired(facts: dict) -> tuple[set[str], list[str]]:
    outcomes = run_rules(RULES, facts)
    fired = [rule for rule, o in outcomes if o.state == "fired"]
    return {rule.id for rule in fired}, advice_of(fired, facts)


def test_frames_read_name_the_python_function_and_no_profiler_is_advised():
    leak = {"reach.leak_function": "take_record, called from Python batch (job.py:3)"}
    facts = {**TARGET, **LEAK, **leak, "target.python_frames": "read"}
    fired, advice = _fired(facts)
    assert "python-frames" in fired and "python-interpreter" not in fired
    assert any(a.startswith("read take_record, called from Python batch (job.py:3): find the path") for a in advice)
    assert not any("py-spy" in a or "memray" in a or "PYTHONTRACEMALLOC" in a for a in advice)


def test_frames_not_read_say_why_and_give_the_python_tools():
    leak = {"reach.leak_function": "PyBytes_FromStringAndSize"}
    facts = {**TARGET, **LEAK, **leak, "target.python_frames": "unsupported version 3.10.13"}
    fired, advice = _fired(facts)
    assert "python-interpreter" in fired and "python-frames" not in fired
    assert not any(a.startswith("read PyBytes_FromStringAndSize") for a in advice)  # the interpreter's code
    assert any("py-spy dump --pid 42" in a for a in advice)
    assert any("PYTHONTRACEMALLOC=25 /usr/bin/python3 orders.py" in a for a in advice)
    finding = next(r for r, _ in run_rules(RULES, facts) if r.id == "python-interpreter").then.finding
    assert "({target.python_frames})" in finding  # the reason is quoted


def test_unnamed_interpreter_frames_under_python_frames_ask_for_no_rebuild():
    """Debian's python3.11 has no symbol table: its static functions are [unknown] in every stack.
    Where the Python frames above them were read, a rebuild with frame pointers names nothing the
    verdict needs; a C library's own unnamed frames still get that advice."""
    from memdiag.diagnose.assemble import _stack_caveats
    from memdiag.diagnose.report import StackReport

    python = ["handle_order (/srv/orders.py:42) [python]", "<module> (/srv/orders.py:50) [python]"]
    interp = StackReport(
        probe="memleak",
        frames=["malloc+0x0 [libc.so.6]", "[unknown] [python3.11]", "[unknown] [python3.11]", *python],
        bytes=1,
        detail="",
    )
    (said,) = _stack_caveats([interp])
    assert said.startswith("2 frame(s) of stacks whose Python frames were read are [unknown] (2 in python3.11)")
    assert "-fno-omit-frame-pointer" not in said and "debug-symbols package" in said
    ctypes = StackReport(
        probe="memleak",
        frames=["malloc+0x0 [libc.so.6]", "[unknown] [libleaky.so]", "[unknown] [python]", *python],
        bytes=1,
        detail="",
    )
    interp_said, native_said = _stack_caveats([ctypes])
    assert "(1 in python)" in interp_said and "code object could not be read" in interp_said
    assert "debug-symbols" not in interp_said  # no interpreter function was unnamed here
    assert native_said.startswith("1 stack frame(s) are [unknown]") and "-fno-omit-frame-pointer" in native_said
    native_only = StackReport(
        probe="memleak", frames=["malloc+0x0 [libc.so.6]", "[unknown] [python3.11]"], bytes=1, detail=""
    )
    (said,) = _stack_caveats([native_only])  # no Python frame read: nothing stands for it
    assert "-fno-omit-frame-pointer" in said
