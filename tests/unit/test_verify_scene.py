"""diagnose/verify.compare_scene: a restarted service's diagnosis against the flight recorder's scene
of the kill before it (the report is the renderers' fixed one, its verdict changed per case)."""

from memdiag.diagnose.report import Culprit, Verdict
from memdiag.diagnose.verify import compare_scene
from test_render import fixture_report

MiB = 1 << 20
SCENE = {"victim_rss_first": 40 * MiB, "victim_rss_last": 180 * MiB, "climb_s": 28.0, "fault_function": None}


def _after(kind: str, pid: int | None):
    base = fixture_report()
    verdict = Verdict(kind=kind, summary="s", confidence=0.9, culprit=Culprit(pid=pid, comm="orderd"))
    return base.model_copy(update={"verdict": verdict})


def _compare(report):
    return compare_scene(SCENE, report, "i1", "PID 9 (orderd)", "the OOM watch")


def test_killed_again_while_climbing_is_still_leaking():
    v = _compare(_after("oom", 123))  # the fixture's target is PID 123, its RSS climbing 48 MiB/min
    assert v.status == "still-leaking" and "killed again at its limit" in v.summary, v.summary
    assert v.rss_rate_after is not None and v.rss_rate_after > 0


def test_another_process_killed_is_not_the_restarted_one_killed_again():
    v = _compare(_after("oom", 456))  # a neighbour's kill says nothing of the restarted process
    assert v.status != "still-leaking" and "killed again" not in v.summary, v.summary


def test_a_kill_of_no_pid_in_a_target_of_no_pid_is_not_killed_again():
    report = _after("oom", None)
    report = report.model_copy(update={"target": report.target.model_copy(update={"pid": None})})
    v = _compare(report)  # None == None: a cgroup's kill whose victim is unknown said nothing of the process
    assert v.status != "still-leaking" and "killed again" not in v.summary, v.summary


def test_a_killed_process_whose_rss_barely_moved_is_not_killed_again_while_climbing():
    report = _after("oom", 123)
    trend = report.counters.trends["process.rss"].model_copy(update={"rate_per_s": 16.0})  # 16 B/s
    counters = report.counters.model_copy(update={"trends": {**report.counters.trends, "process.rss": trend}})
    v = _compare(report.model_copy(update={"counters": counters}))
    assert v.status != "still-leaking", v.summary


def test_growing_again_is_still_leaking_and_a_flat_window_is_not():
    assert _compare(_after("growth", 123)).status == "still-leaking"
    assert _compare(_after("healthy", None)).status != "still-leaking"
