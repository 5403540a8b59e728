"""Every number in the report is true, on fixtures of the cases that were not: a growth whose
headline quoted the last third's rate, a cgroup OOM loop (a sawtooth called "levelled for 0 s",
25 kill records standing for 356 kills), pressure lists naming memdiag and processes outside the
target cgroup, a reclaim stall rounded to "0 s", "see lost" with no lost figures. Each report is
built by the real pipeline (counters, triage, the shipped playbook, the renderer) from fixed
snapshots; the figures checker reads it back against its own tables, and flags the old texts."""

import json
import re

from figures import check_figures
from memdiag.diagnose.evidence import build_counters
from memdiag.diagnose.factset import counter_facts
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.render.jsonout import render_json
from memdiag.diagnose.render.markdown import render_markdown
from memdiag.diagnose.report import Finding, Overhead, ProbeStatus, Report, TargetInfo, Verdict, Window
from memdiag.diagnose.snapshot import Snapshot
from memdiag.diagnose.target import Target
from memdiag.diagnose.triage import triage
from memdiag.diagnose.workflow import load_rules
from memdiag.rules.engine import conclude, run_rules
from memdiag.system.cgroup import CgroupLocation, CgroupMemory
from memdiag.system.kmsg import OomKill
from memdiag.system.meminfo import MemInfo
from memdiag.system.process import ProcessMemory
from memdiag.system.psi import Psi, PsiLine
from memdiag.system.vmstat import VmStat

MiB, GiB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0
CG = CgroupLocation(version=1, path="/app", fs_path="/sys/fs/cgroup/memory/app", mount_point="/sys/fs/cgroup/memory")
MEMDIAG = 4000  # the diagnosing process in these fixtures; 4001 is its BPF compiler child


def _proc(pid, comm, rss, majflt=0, ppid=1):
    return ProcessMemory(pid=pid, comm=comm, cmdline=[comm], rss=rss, majflt=majflt, start_ticks=pid, ppid=ppid)


def _snap(t, *, usage=None, oom_kill=0, failcnt=0, procs=(), process=None, vm=None, psi_us=0, avail=6 * GiB):
    cgroup = None
    if usage is not None:
        cgroup = CgroupMemory(
            version=1, path="/app", fs_path=CG.fs_path, usage=usage, limit=64 * MiB, effective_limit=64 * MiB,
            failcnt=failcnt, oom_kill=oom_kill, procs=list(procs),
        )  # fmt: skip
    return Snapshot(
        t=t,
        wall=T0 + t,
        meminfo=MemInfo(mem_total=8 * GiB, mem_available=avail, mem_free=avail),
        vmstat=VmStat(counters={"oom_kill": 1000 + oom_kill, "pgmajfault": 0, "allocstall": 0} | (vm or {})),
        psi=Psi(some=PsiLine(avg10=0, avg60=0, avg300=0, total_us=psi_us), full=PsiLine(avg10=0, avg60=0, avg300=0,
                total_us=psi_us // 4)),
        process=process,
        cgroup=cgroup,
    )  # fmt: skip


def _observation(target, snapshots, first, last, kills=None):
    return Observation(
        target=target, requested_s=30, started=T0, ended=T0 + snapshots[-1].t, snapshots=snapshots,
        oom_kills=kills or [], processes_first=first, processes_last=last, memdiag_pid=MEMDIAG,
    )  # fmt: skip


def _report(obs, probes=()) -> dict:
    """What the engine does with the counters, then report.json: the playbook picks the verdict."""
    counters = build_counters(obs)
    tri = triage(obs, counters)
    facts = counter_facts(obs, counters, 2.0) | {"target.name": obs.target.describe()}
    facts |= tri.facts
    for p in probes:
        facts |= p.figures
    c = conclude(run_rules(load_rules(), facts), facts)
    verdict = Verdict(kind=c.winner.then.verdict.kind, summary=c.summary, confidence=0.5)
    findings = tri.findings + [Finding(id=rule, summary=text) for rule, text in c.findings]
    report = Report(
        memdiag_version="test",
        target=TargetInfo(kind=obs.target.kind, description=obs.target.describe(), pid=obs.target.pid),
        window=Window(started=obs.started, ended=obs.ended, requested_s=30, samples=len(obs.snapshots)),
        verdict=verdict,
        findings=findings,
        caveats=tri.caveats,
        probes=list(probes),
        overhead=Overhead(budget_percent=2.0),
        counters=counters,
    )
    render_markdown(report)  # the whole renderer runs over it
    return json.loads(render_json(report))


def _accelerating_growth() -> dict:
    """RSS 132 MiB to 431 MiB in 30 s, two thirds of it in the last 10 s."""
    rss = [132 * MiB + int(3.3 * MiB * t) if t <= 20 else 198 * MiB + int(23.3 * MiB * (t - 20)) for t in range(31)]
    target = Target(kind="pid", pid=500, comm="orderd", start_ticks=500)
    snaps = [_snap(t, process=_proc(500, "orderd", r)) for t, r in enumerate(rss)]
    procs = {500: _proc(500, "orderd", rss[-1])}
    return _report(_observation(target, snaps, {500: _proc(500, "orderd", rss[0])}, procs))


def _oom_loop() -> dict:
    """A cgroup at 64 MiB killing its worker every few seconds: 356 kills by the counter in the
    window, the last 25 still in the kernel log."""
    usage = [8 * MiB + (t % 6) * 11 * MiB for t in range(31)]
    kills = [
        OomKill(when=T0 + t, victim_pid=700 + t, victim_comm="worker", oom_memcg="/app",
                task_memcg="/app", anon_rss=60 * MiB, constraint="CONSTRAINT_MEMCG")
        for t in range(5, 30)
    ]  # fmt: skip
    snaps = [_snap(t, usage=u, oom_kill=int(356 * t / 30), failcnt=40 * t, procs=[730]) for t, u in enumerate(usage)]
    target = Target(kind="cgroup", cgroup=CG)
    last = {730: _proc(730, "worker", 30 * MiB), MEMDIAG: _proc(MEMDIAG, "memdiag", 90 * MiB)}
    return _report(_observation(target, snaps, {}, last, kills))


def _pressure(inside: tuple[int, ...] = ()) -> dict:
    """Pressure on a cgroup target; memdiag, its compiler child and a process outside the cgroup
    fault and are bigger than anything inside it (memdiag's pids in `inside` run in the cgroup)."""
    target = Target(kind="cgroup", cgroup=CG)
    members = [800, 801, *inside]
    snaps = [
        _snap(t, usage=60 * MiB, failcnt=50 * t, procs=members, psi_us=int(t * 300_000), vm={"pswpin": 200 * t})
        for t in range(31)
    ]
    first = {
        800: _proc(800, "hog", 50 * MiB, 10), 801: _proc(801, "side", 8 * MiB, 0),
        MEMDIAG: _proc(MEMDIAG, "memdiag", 60 * MiB, 0), 4001: _proc(4001, "python3", 80 * MiB, 0, ppid=MEMDIAG),
        900: _proc(900, "outsider", 2 * GiB, 0),
    }  # fmt: skip
    last = {
        800: _proc(800, "hog", 52 * MiB, 5010), 801: _proc(801, "side", 8 * MiB, 20),
        MEMDIAG: _proc(MEMDIAG, "memdiag", 70 * MiB, 900), 4001: _proc(4001, "python3", 150 * MiB, 300, ppid=MEMDIAG),
        900: _proc(900, "outsider", 2 * GiB, 7000),
    }  # fmt: skip
    stall = {"reclaim.stall_time": 1.36}
    drsnoop = ProbeStatus(name="drsnoop", status="ok", reason="ran", duration_s=4.0, figures=stall)
    return _report(_observation(target, snaps, first, last), probes=[drsnoop])


def test_growth_headline_is_the_whole_window_rate():
    rep = _accelerating_growth()
    assert check_figures(rep) == []
    s = rep["verdict"]["summary"]
    rate = rep["counters"]["trends"]["process.rss"]["rate_per_s"] * 60 / MiB
    assert 500 < rate < 650  # least squares over the window; the last third runs at 1.4 GiB/min
    assert f"grew {rate:.0f} MiB/min over 30 s (132 MiB to 431 MiB; 1.4 GiB/min in the last 9.0 s)" in s, s


def test_growth_figures_of_the_old_headline_are_caught():
    rep = _accelerating_growth()
    old = "RSS of PID 500 (orderd) grew 1.4 GiB/min for 30 s (132 MiB to 431 MiB) and is still climbing"
    problems = check_figures(rep | {"verdict": rep["verdict"] | {"summary": old}})
    assert len(problems) == 1 and "'1.4 GiB/min' matches no value" in problems[0]


def test_oom_loop_counts_kills_by_the_kernel_counter_and_is_no_plateau():
    rep = _oom_loop()
    assert check_figures(rep) == []
    s = rep["verdict"]["summary"]
    assert rep["verdict"]["kind"] == "oom"
    assert "356 kills in the window (the cgroup's oom_kill counter); the kernel log holds 25" in s, s
    assert rep["counters"]["trends"]["cgroup.usage"]["shape"] == "sawtooth"
    assert not [f for f in rep["findings"] if "levelled" in f["summary"] or re.search(r"(?<![\d.])0 s", f["summary"])]
    assert any(f["id"] == "growth-sawtooth" for f in rep["findings"])


def test_a_level_between_oom_kills_is_no_plateau():
    """CI's shape: the OOM loop's samples rose from 17 to 25 MiB, then stayed level for the last 2.4 s
    between kills. The cgroup's counter says the kernel killed in the window: no cache is read from it."""
    usage = [17 * MiB + min(t, 6) * int(1.4 * MiB) for t in range(9)]
    snaps = [_snap(t, usage=u, oom_kill=3 + t // 3, failcnt=40 * t, procs=[730]) for t, u in enumerate(usage)]
    last = {730: _proc(730, "worker", 20 * MiB), MEMDIAG: _proc(MEMDIAG, "memdiag", 90 * MiB)}
    rep = _report(_observation(Target(kind="cgroup", cgroup=CG), snaps, {}, last, []))
    assert check_figures(rep) == []
    assert rep["counters"]["trends"]["cgroup.usage"]["shape"] == "levelled"
    assert not [f for f in rep["findings"] if "plateau" in f["summary"] or "cache" in f["summary"]], rep["findings"]
    killed = next(f for f in rep["findings"] if f["id"] == "growth-killed")
    assert killed["summary"].endswith("with 2 OOM kills in the window"), killed["summary"]
    assert rep["verdict"]["kind"] == "oom", rep["verdict"]


def test_oom_loop_old_figures_are_caught():
    rep = _oom_loop()
    old_verdict = "OOM killer killed PID 729 (worker) (25 kills recorded) at its cgroup limit (/app, limit 64.0 MiB)"
    old_plateau = "memory usage of cgroup /app grew 22.0 MiB then levelled off at 30.0 MiB for the last 0 s: a plateau"
    bad = rep | {
        "verdict": rep["verdict"] | {"summary": old_verdict},
        "findings": [{"id": "growth-plateau", "summary": old_plateau, "evidence": {}}],
    }
    problems = check_figures(bad)
    assert any("'25 kills' matches no value" in p for p in problems), problems
    assert any("'0 s': a duration rounded to nothing" in p for p in problems), problems


def test_memdiag_inside_the_cgroup_it_quotes_says_so_with_its_own_rss():
    assert not any("memdiag itself runs" in c for c in _pressure()["caveats"])
    rep = _pressure(inside=(MEMDIAG, 4001))
    said = [c for c in rep["caveats"] if "memdiag itself runs" in c]
    # memdiag 60 -> 70 MiB and its compiler child 80 -> 150 MiB, charged to /app beside the target
    assert said == [
        "memdiag itself runs in cgroup /app, so the cgroup's counters include its own memory (its RSS "
        "220 MiB at the end, +80.0 MiB over the window); the process table leaves it out"
    ], rep["caveats"]
    assert {r["pid"] for r in rep["counters"]["processes"]} == {800, 801}


def test_pressure_lists_hold_the_cgroups_processes_only():
    rep = _pressure()
    assert check_figures(rep) == []
    s = rep["verdict"]["summary"]
    assert rep["verdict"]["kind"] == "pressure", s
    assert "paying in major faults: PID 800 (hog, 5,000 faults), PID 801 (side, 20 faults)" in s, s
    assert "largest: PID 800 (hog, 52.0 MiB), PID 801 (side, 8.0 MiB)" in s, s
    assert {r["pid"] for r in rep["counters"]["processes"]} == {800, 801}
    reclaim = next(f for f in rep["findings"] if "reclaim during the probe" in f["summary"])
    assert "tasks spent 1.4 s in direct or cgroup reclaim" in reclaim["summary"]


def test_host_pressure_is_not_put_on_a_target_that_did_not_pay():
    """Swap-in and PSI are the host's figures: a cgroup far below its limit whose processes took no
    major fault is not 'under pressure' (a container was, from another test's swap-off)."""
    snaps = [
        _snap(t, usage=20 * MiB, procs=[800], psi_us=int(t * 300_000), vm={"pswpin": 15_000 * t}) for t in range(31)
    ]
    first, last = {800: _proc(800, "redis", 18 * MiB, 0)}, {800: _proc(800, "redis", 19 * MiB, 0)}
    rep = _report(_observation(Target(kind="cgroup", cgroup=CG), snaps, first, last))
    assert check_figures(rep) == []
    v = rep["verdict"]
    assert v["kind"] == "pressure", v
    assert v["summary"].startswith("memory pressure on the host (host-wide counters, seen from cgroup /app (v1))"), v
    assert v["summary"].endswith("; no major fault in cgroup /app (v1) during the window"), v
    findings = {f["id"]: f["summary"] for f in rep["findings"]}
    assert findings["host-memory-pressure"].startswith("the host is under memory pressure that cgroup /app (v1) did")


def test_a_cgroup_that_levelled_off_under_host_pressure_it_did_not_pay_is_a_plateau():
    """What was observed in the target comes first: a cgroup's usage that grew and levelled off,
    under the host's swap-in with no limit hit and no major fault of its own, is a plateau; the
    host's pressure is a finding beside it, said as not paid for."""
    usage = [10 * MiB + min(t, 12) * 3 * MiB for t in range(31)]
    snaps = [_snap(t, usage=u, procs=[800], vm={"pswpin": 500 * t}) for t, u in enumerate(usage)]
    first, last = {800: _proc(800, "redis", 8 * MiB)}, {800: _proc(800, "redis", 44 * MiB)}
    rep = _report(_observation(Target(kind="cgroup", cgroup=CG), snaps, first, last))
    assert check_figures(rep) == []
    assert rep["verdict"]["kind"] == "cache", rep["verdict"]
    assert rep["verdict"]["summary"].startswith("memory usage of cgroup /app (v1) grew 36.0 MiB then levelled off"), rep
    findings = {f["id"]: f["summary"] for f in rep["findings"]}
    assert findings["swap-in"].startswith("pages swapped in 500/s"), findings
    assert findings["host-memory-pressure"] == (
        "the host is under memory pressure that cgroup /app (v1) did not pay for "
        "(no limit hit, no major fault in the window)"
    ), findings


def test_pressure_old_lists_and_rounding_are_caught():
    rep = _pressure()
    old = (
        "memory pressure on cgroup /app: swap-in 200 pages/s; paying in major faults: PID 900 (outsider, 7000 "
        "faults), PID 4000 (memdiag, 900 faults); largest: PID 900 (outsider, 2.0 GiB)"
    )
    bad = rep | {
        "verdict": rep["verdict"] | {"summary": old},
        "findings": [{"id": "playbook", "summary": "tasks spent 0 s in direct or cgroup reclaim during the probe"}],
    }
    problems = check_figures(bad)
    assert any("PID 900 in 'paying in major faults' is not one of the target's processes" in p for p in problems)
    assert any("PID 4000" in p for p in problems) and any("'7000 faults' matches no value" in p for p in problems)
    assert any("'0 s': a duration rounded to nothing" in p for p in problems), problems


def test_system_lists_leave_memdiag_and_its_children_out():
    target = Target(kind="system")
    snaps = [_snap(t, avail=6 * GiB - t * 40 * MiB) for t in range(31)]
    first = {MEMDIAG: _proc(MEMDIAG, "memdiag", 40 * MiB), 4001: _proc(4001, "python3", 10 * MiB, ppid=MEMDIAG),
             600: _proc(600, "grower", 100 * MiB)}  # fmt: skip
    last = {MEMDIAG: _proc(MEMDIAG, "memdiag", 60 * MiB), 4001: _proc(4001, "python3", 900 * MiB, ppid=MEMDIAG),
            600: _proc(600, "grower", 500 * MiB)}  # fmt: skip
    rep = _report(_observation(target, snaps, first, last))
    assert check_figures(rep) == []
    assert {r["pid"] for r in rep["counters"]["processes"]} == {600}
    assert "the fastest growing process is PID 600 (grower, +400 MiB RSS)" in rep["verdict"]["summary"]


def test_see_lost_only_beside_lost_figures():
    rep = _pressure()
    probe = {"name": "memleak", "status": "partial", "reason": "a table filled up (see lost)", "lost": {}}
    assert any("'see lost'" in p for p in check_figures(rep | {"probes": [*rep["probes"], probe]}))
    probe["lost"] = {"table_full": 12}
    assert check_figures(rep | {"probes": [*rep["probes"], probe]}) == []


def test_growth_too_small_for_the_unit_of_its_ends_says_how_much():
    rss = [1024 * MiB + int(0.2 * MiB * t) for t in range(31)]
    target = Target(kind="pid", pid=510, comm="bigheap", start_ticks=510)
    snaps = [_snap(t, process=_proc(510, "bigheap", r)) for t, r in enumerate(rss)]
    obs = _observation(target, snaps, {510: _proc(510, "bigheap", rss[0])}, {510: _proc(510, "bigheap", rss[-1])})
    rep = _report(obs)
    assert check_figures(rep) == []
    assert "grew 12.0 MiB/min over 30 s (1.0 GiB to 1.0 GiB, +6.0 MiB)" in rep["verdict"]["summary"]
