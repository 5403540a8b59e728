"""The Go readers on Go programs built here with the Go toolchain on PATH (Debian's golang-go): the
layouts against the toolchain's own DWARF, the function table against the frames the runtime names
for itself, the heap profile against the program's own pprof output, and the goheap probe on an
error-path map (plain, stripped, not inlined), a bounded cache, a goroutine leak and a program
whose heap profile the linker switched off."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from memdiag.probes.go.heap import _points, _read, run
from memdiag.probes.go.layout import layout_for, load_target
from memdiag.probes.go.memory import GoProcess, scaled
from memdiag.probes.go.pclntab import GoTable
from memdiag.probes.go.view import facts_of
from memdiag.system.target import Target

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kit import GO_ENV, build, go_version, wait_until  # noqa: E402

STRIPPED = ["-ldflags=-s -w"]
NOT_INLINED = ["-gcflags=-l"]
KiB, MiB = 1 << 10, 1 << 20


def _dwarf_members(path: Path, wanted: dict[str, list[str]]) -> dict[str, dict[str, int]]:
    found: dict[str, dict[str, int]] = {}
    with open(path, "rb") as f:
        for cu in ELFFile(f).get_dwarf_info().iter_CUs():
            for die in cu.iter_DIEs():
                name = die.attributes.get("DW_AT_name")
                if die.tag != "DW_TAG_structure_type" or name is None or name.value.decode() not in wanted:
                    continue
                members = {
                    c.attributes["DW_AT_name"].value.decode(): c.attributes["DW_AT_data_member_location"].value
                    for c in die.iter_children()
                    if c.tag == "DW_TAG_member"
                }
                members["<size>"] = die.attributes["DW_AT_byte_size"].value
                found[name.value.decode()] = members
            if len(found) == len(wanted):
                return found
    return found


def test_the_layout_is_the_toolchains_own(root_required):
    binary = build("goerrmap")
    L = layout_for(go_version())
    d = _dwarf_members(
        binary,
        dict.fromkeys(
            ["runtime.g", "runtime.gobuf", "runtime.bucket", "runtime.memRecord", "runtime.gcControllerState"], []
        ),
    )
    g, buf = d["runtime.g"], d["runtime.gobuf"]
    assert (L.g_status, L.g_goid, L.g_waitsince, L.g_waitreason) == (
        g["atomicstatus"],
        g["goid"],
        g["waitsince"],
        g["waitreason"],
    )
    assert (L.g_gopc, L.g_startpc) == (g["gopc"], g["startpc"]) and L.g_read >= g["startpc"] + 8
    assert (L.g_sched_sp, L.g_sched_pc, L.g_sched_bp) == tuple(g["sched"] + buf[f] for f in ("sp", "pc", "bp"))
    assert L.bucket_header == d["runtime.bucket"]["<size>"] and d["runtime.bucket"]["nstk"] == L.bucket_header - 8
    assert d["runtime.memRecord"]["active"] == 0 and d["runtime.memRecord"]["future"] == L.record_size
    pacer, P = d["runtime.gcControllerState"], L.pacer
    assert (P.gc_percent, P.last_heap_goal, P.heap_marked) == (
        pacer["gcPercent"], pacer["lastHeapGoal"], pacer["heapMarked"]
    )  # fmt: skip
    assert (P.heap_in_use, P.heap_free, P.mapped_ready) == (
        pacer["heapInUse"], pacer["heapFree"], pacer["mappedReady"]
    )  # fmt: skip


@pytest.mark.parametrize("program,flags", [("goerrmap", []), ("goerrmap", ["-tags", "noprofile"]), ("goleak", [])])
def test_the_runtimes_variables_found_in_its_code_are_the_symbol_tables(root_required, program, flags):
    """The recipes stripped binaries are read by, checked where the symbol table can say."""
    table = GoTable(str(build(program, flags)))
    L = layout_for(go_version())
    for name, recipe in L.recipes.items():
        assert load_target(table, recipe) == table.symtab[name], name
    assert table.moduledata.address == table.symtab["runtime.firstmoduledata"]
    # functions found by name without a table of every name: the ELF symbol table's addresses
    with open(table.path, "rb") as f:
        funcs = {s.name: s["st_value"] for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()}
    wanted = ["main.main", "runtime.mallocgc", "runtime.MemProfile", "runtime.gcStart", "no.such.function"]
    found = table.entries_of(wanted)
    assert found == {n: funcs[n] for n in wanted if n in funcs}, found
    assert ("runtime.MemProfile" in found) == ("noprofile" not in flags)  # the linker drops it when unreferenced


def _runtime_frames(binary: Path) -> tuple[subprocess.Popen, list[tuple[int, str, int]]]:
    proc = subprocess.Popen([str(binary)], stdout=subprocess.PIPE, text=True)
    frames = []
    for line in proc.stdout:
        if line.startswith("ready"):
            return proc, frames
        pc, function, number = line.split()
        frames.append((int(pc, 16), function, int(number)))
    raise AssertionError(f"{binary} ended before it was ready")


@pytest.mark.parametrize("flags", [[], STRIPPED, NOT_INLINED], ids=["plain", "stripped", "not-inlined"])
def test_frames_are_the_ones_the_runtime_names(root_required, flags):
    binary = build("goframes", flags)
    proc, expected = _runtime_frames(binary)
    try:
        table = GoTable(f"/proc/{proc.pid}/exe")
    finally:
        proc.kill()
        proc.wait()
    got = [(pc, table.frame(pc).function, table.frame(pc).line) for pc, _, _ in expected]
    assert got == expected
    inlined = [table.frame(pc).inlined for pc, _, _ in expected]
    assert any(inlined) == (flags != NOT_INLINED), inlined  # main.leaf, main.middle: inlined unless -l
    assert "main.main.func1.1" in [f for _, f, _ in expected]


def _pprof_inuse(path: Path) -> int:
    """The program's own heap profile, its in-use bytes summed (go tool pprof -raw)."""
    out = subprocess.run(["go", "tool", "pprof", "-raw", str(path)], env=GO_ENV, capture_output=True, text=True)
    samples = re.findall(r"^\s+\d+\s+\d+\s+\d+\s+(\d+): ", out.stdout, re.M)
    assert samples, out.stdout + out.stderr
    return sum(int(s) for s in samples)


def test_the_heap_profile_read_from_outside_is_the_programs_own(workload, tmp_path):
    profile = tmp_path / "heap.pb.gz"
    w = workload("goerrmap", "400", "3", env={"HEAP_PROFILE": str(profile)})
    proc = GoProcess(w.pid)
    try:
        for _attempt in range(10):
            time.sleep(3)  # ~2 MiB kept a second: past the 4 MiB below with the sampling's error
            before = proc.snapshot(goroutines=False)
            profile.unlink(missing_ok=True)
            os.kill(w.pid, signal.SIGUSR1)
            wait_until(profile.exists, "the heap profile written", timeout=10)
            after = proc.snapshot(goroutines=False)
            if before.cycle == after.cycle:  # no GC between: the same published profile
                break
        else:
            pytest.fail("a GC came between every read and the program's own profile")
    finally:
        proc.close()
    ours = sum(scaled(b.allocs - b.frees, b.alloc_bytes - b.free_bytes, after.rate)[1] for b in after.buckets)
    theirs = _pprof_inuse(profile)
    assert after.rate == 512 * KiB and theirs > 4 * MiB
    assert abs(ours - theirs) <= 0.02 * theirs, (ours, theirs)


def _error_path(r, per_s: float, size: int) -> None:
    top = r.stacks[0]
    assert top.functions[0] == "main.rememberFailure", top.frames
    assert top.functions[1:3] == ["main.handle", "main.main"], top.frames
    series = top.inuse_bytes
    assert len(series) >= 4 and all(b >= a for a, b in zip(series, series[1:], strict=False)), series
    # at most what the program kept over the points (its rate, one order in three), with the
    # sampling's error; at least a third of it (a loaded host slows the program's ticker)
    kept = per_s / 3 * size * (r.times[-1] - r.times[0])
    assert kept / 3 <= series[-1] - series[0] <= 1.5 * kept, (series, kept)


@pytest.mark.parametrize("flags", [[], STRIPPED, NOT_INLINED], ids=["plain", "stripped", "not-inlined"])
def test_an_error_path_map_names_the_function_that_inserts(workload, flags):
    w = workload("goerrmap", "400", "3", "16384", flags=flags)
    r = run(Target.for_pid(w.pid), 12)
    assert r.status == "ok", r.reason
    assert r.version == go_version() and r.profile == "on" and r.rate == 512 * KiB
    assert r.stripped == (flags == STRIPPED)
    assert r.found_by == ("the runtime's code" if flags == STRIPPED else "its symbol table")
    _error_path(r, 400, 16384)
    top = r.stacks[0]
    # pprof would name main.handle: the runtime's profile drops the frame that calls mallocgc itself
    assert top.recovered and top.frames[0].startswith("main.rememberFailure (called at main.go:30")
    assert top.frames[0].endswith(", inlined) [goerrmap]") == (flags != NOT_INLINED), top.frames[0]


def test_a_bounded_cache_is_not_a_climb(workload):
    # 6,000 x 16 KiB (94 MiB: ~190 of the runtime's samples at 512 KiB), full after 3 s
    w = workload("gocache", "2000", "6000", "16384")
    time.sleep(8)
    r = run(Target.for_pid(w.pid), 12)
    assert r.status == "ok", r.reason
    f = facts_of(r, None, lambda frames, forwards: None)
    # the first point can be a GC from before the cache was full: flat or levelled, never a climb
    assert f["go.heap_trend"] in ("flat", "levelled"), (r.times, r.heap_inuse)
    assert f["go.largest_function"] == "main.(*cache).fetch"
    assert 60 * MiB < f["go.largest_inuse"] < 130 * MiB  # the 94 MiB held, within the sampling's error
    cache = max(r.stacks, key=lambda s: s.inuse_bytes[-1])
    assert cache.alloc_bytes > 2 * max(cache.inuse_bytes) and cache.freed_bytes > 0  # replaced, not accumulated
    # the GC's own counts: exact, where the profile is an estimate
    assert f["go.gogc"] == 100  # the default (the goroutine test runs one set otherwise)
    assert 94 * MiB <= f["go.heap_marked"] < 130 * MiB  # 6,000 values of 16 KiB, the map and its keys
    reads = list(zip(r.pacer_times, r.pacer_cycles or [None] * len(r.pacer_times), r.heap_marked, strict=True))
    assert f["go.heap_marked_trend"] in ("flat", "levelled"), reads  # each read, its GC cycle, what it marked
    # the goal: marked + (marked + stacks + globals) x GOGC/100 (runtime/mgcpacer.go), about twice
    # the live set; the goal read is the one the last GC ended with, the marked count can be a GC
    # newer (the two are not read in one instant): 198,971,880 for 2 x 99,530,976 in one run
    assert abs(f["go.heap_goal"] - 2 * f["go.heap_marked"]) < 0.1 * f["go.heap_marked"] + 8 * MiB
    assert f["go.runtime_mapped"] >= f["go.heap_retained"] >= f["go.heap_marked"]
    # a pure Go program: its anonymous RSS climbs into what its runtime holds, never beyond it
    assert f["go.beyond_runtime"] < 1 * MiB and f["go.beyond_runtime_trend"] == "flat", (r.rss_anon, r.runtime_mapped)


def test_a_goroutine_leak_is_named_by_what_the_goroutines_run_and_wait_for(workload):
    w = workload("goleak", "100", env={"GOGC": "50"})
    r = run(Target.for_pid(w.pid), 6)
    assert r.status == "ok", r.reason
    assert r.gogc == 50  # the program's own setting, read from its GC pacer
    g = r.groups[0]
    assert g.function == "main.serve.func1" and g.created_by == "main.serve (main.go:27)"
    assert (g.wait, g.waiting_in) == ("chan receive", "main.awaitReply (main.go:20)")
    assert g.counts[-1] - g.counts[0] >= 100, g.counts  # 100 a second, a third of that at least over 6 s
    assert r.goroutines[-1] >= g.counts[-1] and r.goroutines_total[-1] > r.goroutines[-1]


@pytest.mark.parametrize(
    "flags", [["-tags", "noprofile"], ["-tags", "noprofile", *STRIPPED]], ids=["plain", "stripped"]
)
def test_a_heap_profile_the_linker_switched_off_is_said_so(workload, flags):
    w = workload("goerrmap", "400", "3", flags=flags)
    r = run(Target.for_pid(w.pid), 3)
    assert r.status == "ok" and r.profile == "compiled-out" and r.rate == 0 and not r.stacks
    assert "the program never references runtime.MemProfile, so the linker switched" in r.reason
    assert r.goroutines and r.goroutines[-1] >= 1  # goroutines are read either way


def test_not_a_go_program_and_an_unsupported_version(workload):
    w = workload("leak", "64")
    r = run(Target.for_pid(w.pid), 1)
    assert r.status == "unavailable" and "not a Go program" in r.reason
    with pytest.raises(
        Exception, match=r"^unsupported Go version go1\.22\.3 \(memdiag reads the runtime of go1\.19\)$"
    ):
        layout_for("go1.22.3")


def test_page_fault_stacks_in_a_stripped_go_binary_name_the_inlined_function(workload):
    """Native stacks (the faults probe's) of a Go program named by its function table: the call the
    compiler inlined into main.main is its own frame, and the culprit past the runtime's frames."""
    from memdiag.diagnose.culprit import default_classes
    from memdiag.probes import faults

    w = workload("goerrmap", "400", "3", flags=["-tags", "noprofile", *STRIPPED])
    r = faults.run(Target.for_pid(w.pid), 3)
    assert r.status == "ok", r.reason
    kept = [s for s in r.stacks if "main.rememberFailure" in s.functions]
    assert kept, [s.frames[:6] for s in r.stacks[:5]]
    frames = kept[0].frames
    at = kept[0].functions.index("main.rememberFailure")
    assert frames[at : at + 3] == [
        "main.rememberFailure (main.go:21, inlined) [goerrmap]",
        "main.handle (main.go:30, inlined) [goerrmap]",
        "main.main (main.go:51) [goerrmap]",
    ]
    assert default_classes().name(frames).function == "main.rememberFailure"


def test_reads_stop_at_what_the_budget_leaves(workload):
    w = workload("goleak", "100")
    r = run(Target.for_pid(w.pid), 10, allowance_ns=1.0)  # the first read spends it all
    assert r.backed_off and r.status == "partial" and len(r.read_times) == 1
    assert "stopped early: the next read would take its reads' time past what the budget leaves" in r.reason
    assert r.duration_s < 5


def test_reads_between_gcs_keep_no_buckets_of_their_own(workload):
    """The profile is published at GCs: a read in the same cycle as the last one kept repeats it, and
    memdiag keeps none of its buckets (prometheus: +134 MiB of memdiag's RSS over a window of reads)."""
    w = workload("goerrmap", "400", "3", "16384")
    proc = GoProcess(w.pid)
    try:
        snaps, why = _read(proc, Target.for_pid(w.pid), 4, 0.2, time.monotonic, None)
    finally:
        proc.close()
    assert why == "" and len(snaps) >= 10, why
    kept = [s for s in snaps if s.buckets]
    assert [s.cycle for s in kept] == sorted({s.cycle for s in snaps})  # the first read of each cycle
    assert len(kept) < len(snaps)  # GCs come slower than five reads a second
    assert _points(snaps) == kept
    stacks = {id(b.stack) for s in kept for b in s.buckets}
    assert len(stacks) == len({b.stack for s in kept for b in s.buckets})  # each stack one tuple over the reads
