"""What the second-kernel lane found on Debian's stock kernel with cgroup v2, on fixed snapshots run
through the real pipeline (counters, triage, the shipped playbook, the renderer, the figures check):
the cgroup's own memory.pressure is the pressure a v2 target pays (the host's PSI is quoted only where
the cgroup has none or did not stall), memory.stat's anon and file are facts, and a huge-page collapse
(THP `always` there) is not read as the target shrinking."""

import json

from figures import check_figures
from memdiag.diagnose.evidence import build_counters, collapse_healed, thp_collapses
from memdiag.diagnose.factset import counter_facts
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.render.jsonout import render_json
from memdiag.diagnose.render.markdown import render_markdown
from memdiag.diagnose.report import Finding, Overhead, Report, TargetInfo, Verdict, Window
from memdiag.diagnose.snapshot import Snapshot
from memdiag.diagnose.target import Target
from memdiag.diagnose.triage import triage
from memdiag.diagnose.workflow import load_rules
from memdiag.rules.engine import conclude, run_rules
from memdiag.system.cgroup import CgroupLocation, CgroupMemory
from memdiag.system.meminfo import MemInfo
from memdiag.system.process import ProcessMemory
from memdiag.system.psi import Psi, PsiLine
from memdiag.system.vmstat import VmStat

MiB, GiB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0
CG2 = CgroupLocation(version=2, path="/app.slice", fs_path="/sys/fs/cgroup/app.slice", mount_point="/sys/fs/cgroup")


def _psi(some_us: int) -> Psi:
    line = PsiLine(avg10=0, avg60=0, avg300=0, total_us=some_us)
    return Psi(some=line, full=line.model_copy(update={"total_us": some_us // 4}))


def _snap(t, usage, *, cg_psi_us=None, host_psi_us=0, stat=None, vm=None) -> Snapshot:
    cgroup = CgroupMemory(
        version=2, path=CG2.path, fs_path=CG2.fs_path, usage=usage, limit=1 * GiB, effective_limit=1 * GiB,
        failcnt=0, oom_kill=0, procs=[800], stat={"anon": usage - 4 * MiB, "file": 4 * MiB} | (stat or {}),
        pressure=_psi(cg_psi_us) if cg_psi_us is not None else None,
    )  # fmt: skip
    return Snapshot(
        t=t,
        wall=T0 + t,
        meminfo=MemInfo(mem_total=8 * GiB, mem_available=6 * GiB, mem_free=6 * GiB),
        vmstat=VmStat(counters={"oom_kill": 0, "pgmajfault": 0, "allocstall": 0} | (vm or {})),
        psi=_psi(host_psi_us),
        cgroup=cgroup,
    )


def _report(snaps) -> dict:
    obs = Observation(
        target=Target(kind="cgroup", cgroup=CG2), requested_s=30, started=T0, ended=T0 + snaps[-1].t,
        snapshots=snaps, oom_kills=[], processes_first={800: _proc(0)}, processes_last={800: _proc(0)},
        memdiag_pid=4000,
    )  # fmt: skip
    counters = build_counters(obs)
    tri = triage(obs, counters)
    facts = counter_facts(obs, counters, 2.0) | {"target.name": obs.target.describe()} | tri.facts
    c = conclude(run_rules(load_rules(), facts), facts)
    verdict = Verdict(kind=c.winner.then.verdict.kind, summary=c.summary, confidence=0.5, because=c.because)
    report = Report(
        memdiag_version="test",
        target=TargetInfo(kind="cgroup", description=obs.target.describe()),
        window=Window(started=obs.started, ended=obs.ended, requested_s=30, samples=len(snaps)),
        verdict=verdict,
        findings=tri.findings + [Finding(id=rule, summary=text) for rule, text in c.findings],
        overhead=Overhead(budget_percent=2.0),
        counters=counters,
    )
    md = render_markdown(report)
    rep = json.loads(render_json(report))
    rep["facts"], rep["md"] = facts, md
    return rep


def _proc(majflt):
    return ProcessMemory(pid=800, comm="redis", cmdline=["redis"], rss=40 * MiB, majflt=majflt, start_ticks=800)


def test_a_v2_cgroup_that_stalls_is_under_pressure_by_its_own_psi_not_the_hosts():
    """Its tasks stalled 30% of the window (memory.pressure), the host's 50%: the verdict is the
    cgroup's pressure, quoting its own figure; no limit hit, no major fault needed to pay it."""
    snaps = [_snap(t, 40 * MiB, cg_psi_us=t * 300_000, host_psi_us=t * 500_000) for t in range(31)]
    rep = _report(snaps)
    assert check_figures(rep) == []
    v = rep["verdict"]
    assert v["kind"] == "pressure", v
    assert v["summary"].startswith("memory pressure on cgroup /app.slice (v2), its own tasks (memory.pressure): "), v
    assert "tasks of the cgroup stalled on memory 30.0% of the window (its own memory.pressure" in v["summary"], v
    assert "50.0%" not in v["summary"] and "host's PSI" not in v["summary"]
    assert rep["facts"]["cgroup.psi_some"] == 30.0 and rep["facts"]["cgroup.psi_full"] == 7.5
    rows = {(r["scope"], r["name"]): r["last"] for r in rep["counters"]["rows"]}
    assert rows[("cgroup", "psi_some_window")] == 30.0 and rows[("system", "psi_some_window")] == 50.0
    assert "| PSI some over the window | – | 30.0% |" in rep["md"]


def test_a_v2_cgroup_that_did_not_stall_is_not_put_under_the_hosts_pressure():
    snaps = [_snap(t, 40 * MiB, cg_psi_us=t * 1_000, host_psi_us=t * 500_000) for t in range(31)]
    rep = _report(snaps)
    assert check_figures(rep) == []
    findings = {f["id"]: f["summary"] for f in rep["findings"]}
    assert findings["host-psi-stall"].startswith("tasks stalled on memory 50.0% of the window (the host's PSI")
    assert "host-memory-pressure" in findings and "cgroup-psi-stall" not in findings
    assert rep["verdict"]["kind"] == "pressure" and rep["verdict"]["summary"].startswith("memory pressure on the host")


def test_memory_stat_gives_the_cgroups_anon_and_file():
    rep = _report([_snap(t, 40 * MiB, cg_psi_us=0) for t in range(5)])
    assert rep["facts"]["cgroup.anon"] == 36 * MiB and rep["facts"]["cgroup.file"] == 4 * MiB
    rows = {(r["scope"], r["name"]): r["last"] for r in rep["counters"]["rows"]}
    assert rows[("cgroup", "anon")] == 36 * MiB and rows[("cgroup", "file")] == 4 * MiB


def _leak_with_a_collapse(collapses: int) -> list[Snapshot]:
    """A steady 512 KiB/s leak whose usage jumped 3 MiB and fell back 1 MiB below its line late in
    the window (the trial's shape), with `collapses` huge pages collapsed in that interval."""
    snaps = []
    for t in range(31):
        usage = 100 * MiB + t * MiB // 2 + (3 * MiB if t == 26 else 0) - (1 * MiB if t == 27 else 0)
        n = collapses if t > 26 else 0
        snaps.append(_snap(t, usage, cg_psi_us=0, stat={"thp_collapse_alloc": 7 + n}, vm={"thp_collapse_alloc": 50}))
    return snaps


def test_a_huge_page_collapse_is_not_read_as_the_target_shrinking():
    rep = _report(_leak_with_a_collapse(2))
    assert rep["counters"]["trends"]["cgroup.usage"]["shape"] == "climbing"
    assert rep["facts"]["memory.thp_collapses"] == 2  # the cgroup's own count (memory.stat), not the host's
    assert check_figures(rep) == []
    # the same fall with no collapse beside it stays what it is
    assert _report(_leak_with_a_collapse(0))["counters"]["trends"]["cgroup.usage"]["shape"] == "sawtooth"


def test_only_a_fall_a_collapse_explains_is_put_back():
    points = [(0.0, 10.0 * MiB), (1.0, 9.0 * MiB), (2.0, 4.0 * MiB), (3.0, 5.0 * MiB)]
    counts = {0.0: 0, 1.0: 1, 2.0: 2, 3.0: 2}
    # 1 MiB with one collapse: put back; 5 MiB with one: more than a collapse maps, stays
    assert collapse_healed(points, counts) == [(0.0, 10 * MiB), (1.0, 10 * MiB), (2.0, 5 * MiB), (3.0, 6 * MiB)]
    assert collapse_healed(points, {}) == points


def test_the_hosts_collapses_count_where_the_cgroup_has_no_count():
    snaps = [_snap(t, 40 * MiB, vm={"thp_collapse_alloc": 10 + t}) for t in range(5)]
    obs = Observation(
        target=Target(kind="cgroup", cgroup=CG2), requested_s=5, started=T0, ended=T0 + 4, snapshots=snaps,
        oom_kills=[], processes_first={}, processes_last={}, memdiag_pid=4000,
    )  # fmt: skip
    assert thp_collapses(obs) == 4


def _climb_to(last: int) -> dict:
    # 100 MiB a second for 8 s, ending at `last`
    return _report([_snap(float(t), last - (8 - t) * 100 * MiB) for t in range(9)])


def test_a_cgroup_that_ends_the_window_at_its_limit_is_said_to_be_there_not_to_reach_it_in_no_time():
    # a worker its limit kills over and over ends the window at the limit: "reached in ~0.0 s" was said
    rep = _climb_to(1 * GiB)
    growth = next(f["summary"] for f in rep["findings"] if f["id"] == "growth-climbing")
    assert "the cgroup's usage is at its limit 1.0 GiB already" in growth and "reached in" not in growth
    assert check_figures(rep) == []


def test_a_limit_under_a_seconds_growth_away_is_reached_in_under_a_second():
    rep = _climb_to(1 * GiB - 10 * MiB)
    growth = next(f["summary"] for f in rep["findings"] if f["id"] == "growth-climbing")
    assert "(10.0 MiB left) is reached in under a second (an estimate)" in growth, growth
    assert check_figures(rep) == []
