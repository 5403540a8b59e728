"""The culprit is the first frame worth reading, end to end on real programs: behind a malloc
wrapper (listed or only forwarding) and behind operator new without frame pointers, the verdict
and report.json name the wrapper's caller and keep the whole stack, each frame marked; under
CPython the Python frames memdiag read name the culprit by Python function and line."""

import json
import subprocess
from pathlib import Path

from memdiag.diagnose.culprit import split_frame

O2 = ["-O2", "-fomit-frame-pointer"]
PYLIST = Path(__file__).resolve().parent.parent / "workloads" / "pylist.py"
ORDERD = PYLIST.with_name("orderd.c")


def _diagnose(memdiag, out: Path, pid: int) -> dict:
    r = memdiag("--pid", str(pid), "--duration", "20", "--output", str(out), timeout=180)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "report.json").read_text())


def test_a_leak_behind_xmalloc_is_named_by_its_caller(memdiag, workload, tmp_path):
    # three mallocs (and nearly as many frees) an order: at 2,000 orders/s the count (10,263/s)
    # priced memleak at 2.2% here once, over the 2% budget, and it was refused
    w = workload("wrapleak", "1000", "7", flags=O2)
    rep = _diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "leaks from process_order: 1 in 7 allocations" in v["summary"]
    c = v["culprit"]
    assert c["function"] == "process_order"
    assert [split_frame(f)[0] for f in c["stack"][:3]] == ["malloc", "xmalloc", "process_order"]
    assert c["frame_kinds"][:3] == ["allocator", "wrapper", "culprit"]
    assert "read process_order: find the path" in rep["next_steps"][0]
    ticket = next(s for s in rep["stacks"] if any(split_frame(f)[0] == "take_ticket" for f in s["frames"]))
    assert ticket["frame_kinds"][:3] == ["allocator", "guessed-wrapper", "culprit"]
    md = (tmp_path / "report.md").read_text()
    assert "function **`process_order`**" in md and "`xmalloc (wrapleak.c:" in md and "*(wrapper)*" in md
    assert "*(wrapper, guessed)*" in md  # ticket_alloc, in the Stacks section


def test_a_leak_behind_operator_new_without_frame_pointers_is_named_by_its_caller(memdiag, workload, tmp_path):
    w = workload("cxxpaths", "2000", flags=O2)
    rep = _diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "leaks from take(long): 1 in 5 allocations" in v["summary"]
    c = v["culprit"]
    assert c["function"] == "take(long)"
    assert [split_frame(f)[0] for f in c["stack"][:3]] == ["malloc", "operator new(unsigned long)", "take(long)"]
    assert c["frame_kinds"][:3] == ["allocator", "allocator", "culprit"]
    assert "append(long)" not in " ".join(c["stack"])  # the held path stays apart


def test_a_python_target_is_named_by_its_python_frames(memdiag, root_required, tmp_path):
    proc = subprocess.Popen(["/usr/bin/python3", str(PYLIST), "100"], stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().startswith(b"ready")
        rep = _diagnose(memdiag, tmp_path, proc.pid)
    finally:
        proc.kill()
        proc.wait()
    pid = proc.pid
    said = " ".join(f["summary"] for f in rep["findings"])
    assert f"PID {pid} (python3) runs CPython 3." in said and "memdiag read its Python frames" in said
    line = next(i for i, text in enumerate(PYLIST.read_text().splitlines(), 1) if "kept.append(" in text)
    assert rep["verdict"]["culprit"]["function"] == f"remember (pylist.py:{line})"
    steps = "\n".join(rep["next_steps"])
    assert "py-spy" not in steps and "memray" not in steps  # memdiag has the Python stack already
    grown = [s for s in rep["stacks"] if s["probe"] == "memleak" and "interpreter" in s["frame_kinds"]]
    # the native frames still name the interpreter's functions, marked and passed over
    assert grown and any(f.startswith("PyByteArray_") for f in grown[0]["frames"])
    assert grown[0]["frame_kinds"].index("culprit") > grown[0]["frame_kinds"].index("interpreter")


def test_a_gcc_clone_is_named_by_its_function_and_source_line(memdiag, workload, tmp_path):
    """The issue's demo: a -O2 -g service whose leaking function GCC turned into a clone. The culprit
    reads process_order at the line that leaks (the binary's DWARF), the clone kept as a detail;
    the stacks show file:line beside their frames; the flame graph names the same function."""
    w = workload("orderd", "1000", "5", flags=["-O2"])
    rep = _diagnose(memdiag, tmp_path, w.pid)
    leak = next(i for i, text in enumerate(ORDERD.read_text().splitlines(), 1) if "/* LEAK */" in text)
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    c = v["culprit"]
    assert (c["function"], c["source"]) == ("process_order", f"orderd.c:{leak}"), c["stack"]
    assert c["clone"].startswith((".constprop.", ".isra.")), c
    assert "leaks from process_order:" in v["summary"]
    md = (tmp_path / "report.md").read_text()
    assert f"function **`process_order`** at `orderd.c:{leak}` (GCC clone {c['clone']})" in md
    assert f"`process_order (orderd.c:{leak}, GCC clone {c['clone']}) [orderd]`" in md  # in the stack
    page = (tmp_path / "report.html").read_text()
    assert f'<code id="culprit">process_order</code> at <code>orderd.c:{leak}</code> (GCC clone {c["clone"]})' in page
    folded = (tmp_path / "growth.folded").read_text()
    assert ";main;process_order;malloc " in folded and ".constprop" not in folded and ".isra" not in folded
