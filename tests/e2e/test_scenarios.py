"""The whole workflow on the real kernel, one scenario each, at the default 30 s window and 2%
budget: counters -> playbook -> probes -> verdict. Each asserts the verdict's kind and culprit."""

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from browser import HIGHLIGHTED, Browser
from kit import GO_ENV, swapped_bytes, wait_until
from memdiag.system import arch

MiB = 1 << 20
REPORT_FILES = {"report.md", "report.json", "report.html", "growth.svg", "growth.folded", "profile.pb.gz"}


def _diagnose(memdiag, out: Path, *args: str) -> dict:
    r = memdiag(*args, "--output", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    rep = json.loads((out / "report.json").read_text())
    assert rep["window"]["ended"] - rep["window"]["started"] <= 30 + 10  # within the window (+ probe teardown)
    return rep


def _trail(rep: dict, kind: str, name: str) -> list[dict]:
    return [t for t in rep["trail"] if t["kind"] == kind and t["name"] == name]


def test_leak(memdiag, workload, tmp_path):
    w = workload("leak", "2048")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "leak_order_history" in v["summary"]
    assert any(f.startswith("leak_order_history (leak.c:") for f in v["culprit"]["stack"]), v["culprit"]  # its line
    assert v["culprit"]["pid"] == w.pid and v["culprit"]["comm"] == "leak"
    assert {f.name for f in tmp_path.iterdir()} >= REPORT_FILES
    assert _trail(rep, "budget", "memleak")[0]["state"] == "full"
    assert any(t["state"] == "fired" for t in _trail(rep, "rule", "leak-unreachable"))
    scan = _trail(rep, "scan", "reach")[0]
    assert scan["state"] == "ran" and "paused the target" in scan["reason"]
    top = rep["stacks"][0]
    assert top["reach"]["leaked_count"] > 1000 and top["reach"]["anchored_count"] <= 2
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"]
    md = (tmp_path / "report.md").read_text()
    assert md.startswith(f"# memdiag: leak — PID {w.pid} (leak)")
    assert "## What memdiag ran and why" in md and "### Stacks" in md
    html = (tmp_path / "report.html").read_text()
    assert "<table>" in html and "leak_order_history" in html
    assert "leak_order_history" in (tmp_path / "growth.folded").read_text()
    svg = (tmp_path / "growth.svg").read_text()
    assert svg.startswith("<svg") and "leak_order_history" in svg
    # the growth stacks as a pprof profile: Debian's go tool pprof puts the culprit on top, with the
    # bytes the report's heaviest stack holds (malloc, the allocator's own frame, left out)
    top = subprocess.run(["go", "tool", "pprof", "-top", str(tmp_path / "profile.pb.gz")], env=GO_ENV,
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    rows = re.findall(r"^ *(\S+) +\S+% +\S+% +\S+ +\S+% +(.+)$", top.stdout, re.M)
    assert "Type: inuse_space" in top.stdout and rows[0][1] == "leak_order_history", top.stdout + top.stderr
    page = (tmp_path / "report.html").as_uri()
    with Browser(tmp_path / "profile") as b:  # the page as a real browser runs it
        b.open(page)
        assert b.errors() == [] and b.requests() == [page]
        assert b.eval("document.querySelector('#memory-chart canvas') !== null")
        b.eval("memdiag.flame.search('leak_order_history')")
        assert b.eval(HIGHLIGHTED) == ["leak_order_history"]


def test_a_rust_release_binary_names_its_rust_function(memdiag, workload, tmp_path):
    """A release build (no frame pointers; lld's layout, its code starting inside a page) keeps the
    buffers of failed settlements in a Vec: unwound through .eh_frame, named from .symtab."""
    w = workload("claims", "200")  # ~2 MiB/s kept
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "growth", v["summary"]  # held by the Vec: reachable, not leaked
    assert "claims::settle_claim" in (v["culprit"]["function"] or ""), v["culprit"]
    assert "claims::settle_claim" in v["summary"], v["summary"]


def test_a_leak_that_starts_after_the_first_look_is_still_traced(memdiag, workload, tmp_path):
    """Only churn for the first 12 s, past the first look (9 s of 30): the rules asked for nothing
    there, and before they looked again the leak was never traced (verdict growth, no probe run)."""
    w = workload("leak", "2048", "1024", "12")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "leak" and "leak_order_history" in v["summary"], v["summary"]
    # allocation tracing priced (and run) at a later look, once the growth showed
    assert _trail(rep, "budget", "memleak")[0]["at_s"] > 12
    assert _trail(rep, "probe", "memleak")[0]["state"] == "ok"


@pytest.mark.parametrize("allocator", ["glibc", "jemalloc"])
def test_error_branch_leak_is_a_leak(memdiag, workload, tmp_path, allocator):
    """1 in 7 orders is dropped on an error path; the stack frees the other six. Under jemalloc its
    records of its extents and its thread caches' stale slots are no roots (reach/allocmeta.py): they
    held a quarter of the leak's blocks, and the verdict was growth."""
    if allocator == "glibc":
        w = workload("errleak", "2000", "7")  # ~4,000 allocator calls/s: well inside the 2% budget here
    else:  # malloc+0 single-stepped (free at its first branch, emulated): a tenth of the rate fits the budget
        w = workload("errleak", "400", "7", env={"LD_PRELOAD": arch.library("libjemalloc.so.2")})
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "leaks from process_order: 1 in 7 allocations is never freed and nothing points at it" in v["summary"]
    assert any(f.startswith("process_order (errleak.c:") for f in v["culprit"]["stack"]), v["culprit"]  # its line
    stack = next(s for s in rep["stacks"] if any("process_order" in f for f in s["frames"]))
    assert stack["reach"]["leaked_count"] > (500 if allocator == "glibc" else 100)
    assert stack["reach"]["anchored_count"] <= 2
    md = (tmp_path / "report.md").read_text()
    assert "at the scan: **leaked**" in md
    ran = {p["name"]: p for p in rep["probes"]}
    assert ran["reach"]["status"] == "ok" and ran["reach"]["overhead_percent"] > 0
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"]


def test_growing_registry_is_growth_with_its_anchor(memdiag, workload, tmp_path):
    w = workload("registry", "2000")
    # the scan is what tells held from leaked: at the default 2% it fits on some hosts and not on
    # others (on a host whose traps cost twice, 208 ms of pause against 183 ms left); 5% pays for it
    # everywhere (without it the verdict is growth with the scan's absence said: test_leakcache)
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid), "--budget", "5")
    v = rep["verdict"]
    assert v["kind"] == "growth", v["summary"]
    assert "register_entry keeps adding blocks the program still holds" in v["summary"]
    assert "reachable from `registry` in registry's .bss" in v["summary"]
    assert any(t["state"] == "fired" for t in _trail(rep, "rule", "growth-held"))
    assert rep["stacks"][0]["reach"]["leaked_count"] == 0


def test_scan_over_budget_falls_back_to_the_trend(memdiag, workload, tmp_path):
    w = workload("bigheap", "1024")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid), "--budget", "0.5")
    scan = _trail(rep, "scan", "reach")
    assert scan and scan[0]["state"] == "skipped" and "ms allowed" in scan[0]["reason"], rep["trail"]
    ran = {p["name"]: p for p in rep["probes"]}
    assert ran["reach"]["status"] == "not-run"
    assert all(s.get("reach") is None for s in rep["stacks"])
    v = rep["verdict"]
    assert not (v["kind"] == "leak" and v["confidence"] > 0.6), v  # no evidence, no confident leak
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"]


def test_bounded_cache_is_not_a_leak(memdiag, workload, tmp_path):
    w = workload("cache", "64", "6")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "cache", v["summary"]
    assert "cache_insert" in v["summary"] or "levelled off" in v["summary"]


def test_churn_is_healthy(memdiag, workload, tmp_path):
    w = workload("churn", "200000")
    time.sleep(1)
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    assert rep["verdict"]["kind"] == "healthy", rep["verdict"]["summary"]
    assert not [p for p in rep["probes"] if p["status"] != "not-run"]  # nothing to escalate to


def test_waves_that_give_back_all_they_take_are_healthy(memdiag, workload, tmp_path):
    """32 MiB taken and given back every 5 s: a sawtooth whose troughs come back to the same base,
    healthy with its troughs and peaks said (before: inconclusive, "no one rate describes it")."""
    w = workload("waves", "5", "32", "0")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v, tr = rep["verdict"], rep["counters"]["trends"]["process.rss"]
    assert v["kind"] == "healthy", v["summary"]
    assert any(t["state"] == "fired" for t in _trail(rep, "rule", "sawtooth-level"))
    assert tr["shape"] == "sawtooth" and tr["base"] == "level" and len(tr["troughs"]) >= 2, tr
    assert min(tr["peaks"]) - max(tr["troughs"]) > 24 * MiB, tr  # each wave seen, each given back
    assert "troughs of" in v["summary"] and "from peaks of" in v["summary"]


def test_waves_that_leave_a_step_behind_are_not_called_bounded(memdiag, workload, tmp_path):
    """The same waves, each leaving 8 of its 32 MiB mapped: troughs that rise are growth in steps,
    never a sawtooth's level base (healthy or cache)."""
    w = workload("waves", "5", "32", "4")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v, tr = rep["verdict"], rep["counters"]["trends"]["process.rss"]
    assert v["kind"] not in ("healthy", "cache"), v["summary"]
    assert not any(t["state"] == "fired" for t in _trail(rep, "rule", "sawtooth-level"))
    assert tr["shape"] == "climbing" or tr["base"] == "rising", tr
    assert tr["last"] - tr["first"] > 16 * MiB, tr  # the steps left behind


def test_heap_growth_by_brk(memdiag, workload, tmp_path):
    w = workload("mapper", "256", "0")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "growth", v["summary"]
    assert "grow_heap_with_brk" in v["summary"]


def test_mappings_nothing_points_at_are_a_leak(memdiag, workload, tmp_path):
    """map_buffers() maps a region, fills it and drops the pointer: memleak traces mmap (the
    count found mmap calls though no malloc), and the scan finds nothing pointing at them."""
    w = workload("mapper", "0", "512")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "map_buffers" in v["summary"] and "nothing points at it" in v["summary"]
    assert _trail(rep, "budget", "memleak")[0]["state"] == "full"


def test_a_cgroups_process_that_leaks_is_traced_and_its_leak_is_a_leak(memdiag, workload, memcg, tmp_path):
    """A cgroup of a supervisor and three shards, one of which drops records on its merge path:
    allocation tracing is per process, so it is aimed at the process that grew the cgroup, and the
    scan finds its blocks unreachable (before: only page faults traced over the cgroup, "growth")."""
    cg = memcg(None)
    workload("shards", "3", "2000", "3", cgroup=cg)

    def merging() -> list[int]:  # each shard names itself after its fork: wait for the names
        return [p for p in cg.pids() if Path(f"/proc/{p}/comm").read_text().strip() == "shard-merge"]

    wait_until(lambda: len(cg.pids()) == 4 and merging(), "the supervisor and its three shards, named")
    leaky = merging()
    assert len(leaky) == 1
    rep = _diagnose(memdiag, tmp_path, "--cgroup", cg.path)
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "apply_update" in v["summary"] and v["culprit"]["function"] == "apply_update", v["culprit"]
    assert v["culprit"]["pid"] == leaky[0] and v["culprit"]["comm"] == "shard-merge"
    ran = _trail(rep, "probe", "memleak")[0]
    assert ran["state"] == "ok" and f"on PID {leaky[0]} (shard-merge)" in ran["reason"], ran
    assert any(t["state"] == "fired" for t in _trail(rep, "rule", "cgroup-grower-traced"))
    assert rep["stacks"][0]["reach"]["leaked_count"] > 100


def test_oom_kill_in_a_limited_cgroup(memdiag, workload, memcg, tmp_path):
    cg = memcg(64 * MiB, swap=False)
    w = workload("hog", "512", "4", "300", cgroup=cg)  # reaches the limit after ~5 s
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "oom", v["summary"]
    assert v["culprit"]["pid"] == w.pid and v["culprit"]["cgroup"] == cg.path
    assert f"PID {w.pid} (hog)" in v["summary"] and "64.0 MiB" in v["summary"]
    assert rep["window"]["target_exited_at"] is not None


def test_swap_pressure(swap, memdiag, workload, memcg, tmp_path):
    cg = memcg(96 * MiB)
    w = workload("hog", "256", "8", "10", cgroup=cg)
    wait_until(lambda: swapped_bytes(w.pid) >= 8 * MiB, "the hog swapping")  # past its 96 MiB
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    v = rep["verdict"]
    assert v["kind"] == "pressure", v["summary"]
    assert "pages swapped in" in v["summary"]  # the swap-in rule fired and the verdict quotes it
    assert f"PID {w.pid} (hog" in v["summary"]  # the process paying in major faults
    ran = {p["name"]: p for p in rep["probes"]}
    assert ran["swapin"]["status"] == "ok" and "anonymous memory" in ran["swapin"]["method"]


def test_hot_allocator_stays_in_budget_and_its_leak_is_a_leak(memdiag, workload, tmp_path):
    """Millions of malloc/free a second: tracing them all is refused, page faults name the function
    that grows, and only its own calls to malloc are traced (sites): its blocks, still allocated by
    glibc's headers and pointed at by nothing once the target is stopped, are a leak."""
    w = workload("hot", "1024")
    rep = _diagnose(memdiag, tmp_path, "--pid", str(w.pid))
    budget = _trail(rep, "budget", "memleak")
    assert budget and budget[0]["state"] == "fallback" and "> budget 2%" in budget[0]["reason"]
    ran = {p["name"]: p for p in rep["probes"]}
    assert ran["memleak"]["status"] == "not-run"
    assert ran["faults"]["status"] == "ok"
    assert ran["sites"]["status"] == "ok" and "calls of leak_session_cache traced" in ran["sites"]["reason"]
    assert [t["name"] for t in rep["trail"] if t["kind"] == "probe"] == ["faults", "sites"]
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert v["summary"].startswith(f"PID {w.pid} (hot) leaks from leak_session_cache: every allocation is never freed")
    figures = ran["sites"]["figures"]
    # hot.c drops every block leak_session_cache returns: all but the newest (still in a register
    # or on the stack when the target stops) are unreachable
    assert figures["sites.leaked_count"] >= figures["sites.calls"] - 2 >= 3, figures
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"]


def test_a_playbook_rule_changes_the_diagnosis(memdiag, workload, tmp_path):
    w = workload("churn", "1000")
    rules = tmp_path / "site.yaml"
    rules.write_text(
        "rules:\n"
        "  - id: site-rss-ceiling\n"
        "    description: our services must stay under 1 MiB of anonymous memory\n"
        "    when: process.rss_anon > 256KiB\n"
        "    then:\n"
        "      verdict: {kind: growth, summary: 'over the site ceiling: {process.rss_anon} anonymous', "
        "confidence: 0.9, priority: 500}\n"
    )
    out = tmp_path / "out"
    rep = _diagnose(memdiag, out, "--pid", str(w.pid), "--duration", "6", "--playbook", str(rules))
    assert rep["verdict"]["kind"] == "growth"
    assert rep["verdict"]["summary"].startswith("over the site ceiling: ")
    assert any(t["name"] == "site-rss-ceiling" and t["source"] == f"{rules}:2" for t in rep["trail"])


def test_bad_rule_file_is_refused_with_file_and_line(memdiag, root_required, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: typo\n    when: proces.rss > 1GiB\n    then: {finding: x}\n")
    r = memdiag("--pid", "1", "--playbook", str(bad), "--duration", "1")
    assert r.returncode == 2
    assert f"{bad}:3: rule typo when: unknown fact `proces.rss`; did you mean `process.rss`?" in r.stderr
    assert "Traceback" not in r.stderr
    r = memdiag("rules", "check", str(bad))
    assert r.returncode == 2 and "did you mean `process.rss`" in r.stderr
