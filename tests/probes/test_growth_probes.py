"""faults, brkstack and mmapsnoop name the function that grows memory, through glibc's frameless
code, on the real kernel."""

import time

import pytest
from memdiag.probes import brkstack, faults, mmapsnoop
from memdiag.system.target import Target

MiB = 1 << 20


def _functions(stack):
    return [f for f in stack.functions if f]


def test_faults_name_the_leaking_function_through_glibc(workload):
    w = workload("leak", "4096")
    r = faults.run(Target.for_pid(w.pid), 3)
    assert r.status == "ok", r.reason
    top = r.stacks[0]
    assert "leak_order_history" in _functions(top)
    assert top.functions[0] in ("_int_malloc", "sysmalloc", "malloc")  # the fault happened inside glibc
    assert top.method == "eh_frame"
    grown = sum(s.bytes for s in r.stacks if "leak_order_history" in _functions(s))
    assert grown > 6 * MiB  # 4 MiB/s for 3 s, pages actually touched
    assert r.cost.events >= 1000 and r.lost["stack_errors"] == 0
    assert any("leak_order_history" in line for line in r.folded)
    assert all(line.rsplit(" ", 1)[1].isdigit() for line in r.folded)
    # the stacks kept show where in leak.c (-g): pages fault in its malloc (line 10), at o->id = id (13)
    # or in memset (14)
    lined = {f for s in r.stacks for f in s.frames if f.startswith("leak_order_history")}
    assert lined and lined <= {f"leak_order_history (leak.c:{n}) [leak]" for n in (10, 13, 14)}, lined


def test_faults_in_cpp_name_the_method_behind_operator_new(workload):
    w = workload("cppleak", "4096")
    r = faults.run(Target.for_pid(w.pid), 2)
    assert any("OrderBook::record(long)" in _functions(s) for s in r.stacks[:3])


@pytest.mark.alone  # the biggest faulter of the whole host: no emulated machine faulting beside it
def test_faults_per_process_without_target(workload):
    w = workload("leak", "8192")
    r = faults.run(Target(kind="system"), 2)
    assert r.status == "ok" and r.stacks == []
    mine = [p for p in r.per_process if p.pid == w.pid]
    assert mine and mine[0].comm == "leak" and mine[0].faults > 1000
    assert r.per_process[0].pid == w.pid  # the biggest faulter on a quiet machine


def test_faults_stop_when_the_target_exits(workload):
    w = workload("leak", "4096")
    started = time.monotonic()
    import threading

    threading.Timer(6, w.stop).start()  # after the program is compiled and attached
    r = faults.run(Target.for_pid(w.pid), 40)
    assert time.monotonic() - started < 25
    assert r.target_exited_at is not None and r.duration_s < 10
    assert any("leak_order_history" in _functions(s) for s in r.stacks)  # the partial result is kept


def test_brkstack_names_the_heap_grower(workload):
    w = workload("mapper", "256", "0")
    r = brkstack.run(Target.for_pid(w.pid), 2)
    assert r.status == "ok", r.reason
    top = r.stacks[0]
    assert "grow_heap_with_brk" in _functions(top)
    assert top.functions[:2] == ["brk", "sbrk"]
    assert 3 * MiB < r.heap_growth < 7 * MiB  # 256 KiB ten times a second for 2 s
    assert top.count >= 15


def test_mmapsnoop_names_the_mapper_and_the_kind(workload):
    w = workload("mapper", "0", "512")
    r = mmapsnoop.run(Target.for_pid(w.pid), 2)
    assert r.status == "ok", r.reason
    top = r.stacks[0]
    assert "map_buffers" in _functions(top)
    assert top.kind == "anon private rw"
    assert top.bytes == top.count * 512 * 1024
    assert r.mapped_bytes >= 15 * 512 * 1024
