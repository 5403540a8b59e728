"""CPython targets named in Python's terms, end to end on Debian's /usr/bin/python3.11: the BPF walk
records the Python frames at each allocation, mmap and page fault, so the verdict names the Python
function and line, the holder of held growth is the global that holds it, a C library's leak
through ctypes is named with its Python caller, and small objects (pymalloc's arenas, never
malloc'd) are attributed to the line that makes them. The lines are found in the workloads'
sources, never written here."""

import json
from pathlib import Path

from kit import SOURCES, build_library

WINDOW = ["--duration", "20"]


def _line(workload: str, text: str) -> int:
    """The line of a workload's source that holds text (once)."""
    lines = [i for i, line in enumerate((SOURCES / workload).read_text().splitlines(), 1) if text in line]
    assert len(lines) == 1, (workload, text, lines)
    return lines[0]


def _diagnose(memdiag, out: Path, pid: int) -> dict:
    r = memdiag("--pid", str(pid), *WINDOW, "--output", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "report.json").read_text())


def _no_python_tool_advice(rep: dict) -> None:
    steps = "\n".join(rep["next_steps"])
    assert "py-spy" not in steps and "memray" not in steps and "PYTHONTRACEMALLOC" not in steps, steps
    said = " ".join(f["summary"] for f in rep["findings"])
    assert "memdiag read its Python frames" in said, said


def test_an_error_branch_keeping_payloads_names_the_python_line_and_the_global(memdiag, workload, tmp_path):
    w = workload("pyorders", "200")
    rep = _diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    line = _line("pyorders.py", "payload = bytearray(16384)")
    assert v["kind"] == "growth", v["summary"]
    assert v["culprit"]["function"] == f"handle_order (pyorders.py:{line})"
    assert "reachable from `__main__.failed` (a list)" in v["summary"]
    kinds = dict(zip(v["culprit"]["stack"], v["culprit"]["frame_kinds"], strict=False))
    assert kinds[f"handle_order ({SOURCES / 'pyorders.py'}:{line}) [python]"] == "culprit"
    assert "interpreter" in kinds.values()  # the interpreter's frames stay, passed over
    assert any("bound what `__main__.failed` (a list) holds" in s for s in rep["next_steps"])
    _no_python_tool_advice(rep)


def test_a_leak_in_c_called_through_ctypes_names_the_c_function_and_its_python_caller(memdiag, workload, tmp_path):
    w = workload("pyctypes", str(build_library("drop")), "1000")
    rep = _diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    line = _line("pyctypes.py", "lib.take_record(4096)")
    assert v["kind"] == "leak", v["summary"]
    assert v["culprit"]["function"] == "take_record"
    assert f"leaks from take_record, called from Python process_batch (pyctypes.py:{line}): 1 in 7" in v["summary"]
    assert v["culprit"]["frame_kinds"][:2] == ["allocator", "culprit"]
    assert any(s.startswith("read take_record, called from Python process_batch") for s in rep["next_steps"])
    _no_python_tool_advice(rep)


def test_small_objects_are_attributed_through_pymalloc_arena_growth(memdiag, workload, tmp_path):
    w = workload("pysmall", "20000")
    rep = _diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    line = _line("pysmall.py", "seen.append((")
    assert v["kind"] == "growth", v["summary"]
    assert v["culprit"]["function"] == f"remember (pysmall.py:{line})"
    # the stack the verdict rests on is pymalloc mapping an arena, never a malloc of these objects
    assert v["culprit"]["stack"][0].startswith("mmap")
    mine = f"pysmall.py:{line}) [python]"
    arenas = [s for s in rep["stacks"] if s["frames"][0].startswith("mmap") and any(mine in f for f in s["frames"])]
    assert arenas and sum(s["bytes"] for s in arenas) >= 4 << 20  # whole 1 MiB arenas, several
    _no_python_tool_advice(rep)
