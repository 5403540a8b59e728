"""Verdict policy lives in the playbook alone: on fixture snapshots run through the real counters,
triage and fact set, a copy of the shipped playbook with one YAML edit changes the verdict. Each
test fails if the threshold, the verdict or the precedence were still decided in Python."""

from pathlib import Path

import pytest
from memdiag.diagnose.engine import Engine
from memdiag.diagnose.evidence import build_counters
from memdiag.diagnose.factset import counter_facts
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.snapshot import Snapshot
from memdiag.diagnose.target import Target
from memdiag.diagnose.triage import triage
from memdiag.rules.engine import advice_of, conclude, render, run_rules
from memdiag.rules.loader import RuleFileError, load_file, load_playbooks, playbook_paths, shipped_playbooks
from memdiag.system.meminfo import MemInfo
from memdiag.system.process import ProcessMemory
from memdiag.system.psi import Psi, PsiLine
from memdiag.system.vmstat import VmStat

MiB, GiB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0
SHIPPED = shipped_playbooks()[0].read_text()
assert shipped_playbooks()[0].name == "default.yaml"


def _proc(rss: int, majflt: int = 0, swap: int = 0) -> ProcessMemory:
    return ProcessMemory(
        pid=500, comm="orderd", cmdline=["orderd"], rss=rss, majflt=majflt, vm_swap=swap, start_ticks=500
    )


def _facts(rss, *, swapin_per_s=0, allocstall_per_s=0.0, majflt=0) -> dict:
    """A process over len(rss) one-second samples, with the host's swap-in and direct reclaim
    rates as given, through the real pipeline: counters, triage, fact set."""
    obs = _obs(rss, swapin_per_s=swapin_per_s, allocstall_per_s=allocstall_per_s, majflt=majflt)
    counters = build_counters(obs)
    return counter_facts(obs, counters, 2.0) | {"target.name": obs.target.describe()} | triage(obs, counters).facts


def _obs(rss, *, swapin_per_s=0, allocstall_per_s=0.0, majflt=0) -> Observation:
    snaps = [
        Snapshot(
            t=t,
            wall=T0 + t,
            meminfo=MemInfo(mem_total=8 * GiB, mem_available=6 * GiB, mem_free=6 * GiB),
            vmstat=VmStat(
                counters={
                    "pswpin": swapin_per_s * t,
                    "pswpout": 0,
                    "allocstall": int(allocstall_per_s * t),
                    "pgmajfault": majflt * t,
                    "oom_kill": 7,
                }
            ),  # fmt: skip
            psi=Psi(
                some=PsiLine(avg10=0, avg60=0, avg300=0, total_us=0),
                full=PsiLine(avg10=0, avg60=0, avg300=0, total_us=0),
            ),
            process=_proc(r, majflt * t, swap=8 * MiB if majflt else 0),  # its faults come back from swap
        )
        for t, r in enumerate(rss)
    ]
    return Observation(
        target=Target(kind="pid", pid=500, comm="orderd", start_ticks=500), requested_s=len(rss), started=T0,
        ended=T0 + snaps[-1].t, snapshots=snaps, oom_kills=[], processes_first={500: _proc(rss[0])},
        processes_last={500: _proc(rss[-1], majflt * len(rss))}, memdiag_pid=4000,
    )  # fmt: skip


FLAT = [100 * MiB] * 21
CLIMBING = [100 * MiB + t * 4 * MiB for t in range(20)]


def _playbook(tmp_path: Path, *edits: tuple[str, str], extra: str = "") -> list:
    """Policy as a diagnosis loads it (memdiag.rules.loader.playbook_paths) with a site folder
    holding a copy of default.yaml with each (old, new) edit made once and extra rules appended:
    the copy replaces the shipped file, as a site would install it."""
    text = SHIPPED
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    site = tmp_path / "site"
    site.mkdir(mode=0o755, exist_ok=True)
    path = site / "default.yaml"
    path.write_text(text + extra)
    path.chmod(0o644)
    paths = playbook_paths(site=site)
    assert path in paths and shipped_playbooks()[0] not in paths, paths
    return load_playbooks(paths)


def _verdict(rules: list, facts: dict) -> tuple[str, str, str]:
    """The rule the engine would conclude with (the highest-priority fired verdict): id, kind, summary."""
    c = conclude(run_rules(rules, facts), facts)
    return c.winner.id, c.winner.then.verdict.kind, c.summary


SHIPPED_RULES = load_playbooks(shipped_playbooks())


def test_a_swap_in_threshold_is_a_yaml_edit(tmp_path):
    facts = _facts(FLAT, swapin_per_s=100, majflt=5)  # the target pays: its process took major faults
    rule, kind, summary = _verdict(SHIPPED_RULES, facts)
    assert (rule, kind) == ("memory-pressure", "pressure")
    assert "pages swapped in 100/s" in summary and "PID 500 (orderd" in summary, summary
    stricter = _playbook(tmp_path, ("&swap-in system.swapin_rate > 64/s", "&swap-in system.swapin_rate > 200/s"))
    assert _verdict(stricter, facts)[:2] == ("stable", "healthy")


def test_the_direct_reclaim_threshold_is_the_playbooks_alone(tmp_path):
    """Triage fired on any reclaim rate above zero, the playbook at 1/s: now only the playbook's counts."""
    facts = _facts(FLAT, allocstall_per_s=0.5, majflt=5)
    assert facts["system.direct_reclaim_rate"] == 0.5
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("stable", "healthy")
    fired = {r.id for r, o in run_rules(SHIPPED_RULES, facts) if o.state == "fired"}
    assert "direct-reclaim" not in fired  # no finding of it either
    looser = _playbook(tmp_path, ("system.direct_reclaim_rate > 1/s", "system.direct_reclaim_rate > 0.25/s"))
    assert _verdict(looser, facts)[:2] == ("memory-pressure", "pressure")
    fired = [r for r, o in run_rules(looser, facts) if o.state == "fired"]
    findings = [render(r.then.finding, facts) for r in fired if r.then.finding]
    assert "allocations stalled in direct reclaim 0.5/s" in findings, findings


def test_too_few_samples_is_a_threshold_of_the_playbook(tmp_path):
    facts = _facts(FLAT[:4])
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("stable", "healthy")
    patient = _playbook(
        tmp_path,
        ('{all: ["window.samples < 3", "oom.kills == 0"]}', '{all: ["window.samples < 5", "oom.kills == 0"]}'),
        ("when: window.samples >= 3\n", "when: window.samples >= 5\n"),
    )
    rule, kind, summary = _verdict(patient, facts)
    assert (rule, kind, summary) == ("too-few-samples", "inconclusive", "too few samples (4) to tell a trend")


def test_a_new_verdict_is_a_yaml_edit(tmp_path):
    facts = _facts(FLAT)
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("stable", "healthy")
    extra = """
  - id: site-rss-ceiling
    description: this site's services must stay under 64 MiB resident
    when: process.rss > 64MiB
    then:
      verdict:
        kind: growth
        summary: "{target.name} holds {process.rss}, over the 64 MiB ceiling"
        confidence: 0.7
        priority: 15
      advice: ["restart {target.name} in its 64 MiB cgroup"]
"""
    rules = _playbook(tmp_path, extra=extra)
    rule, kind, summary = _verdict(rules, facts)
    assert (rule, kind) == ("site-rss-ceiling", "growth")
    assert summary == "PID 500 (orderd) holds 100 MiB, over the 64 MiB ceiling"
    fired = [r for r, o in run_rules(rules, facts) if o.state == "fired"]
    assert advice_of(fired, facts) == ["restart PID 500 (orderd) in its 64 MiB cgroup"]


def test_a_site_precedence_is_a_yaml_edit(tmp_path):
    """Host pressure the target did not pay for comes after the target's own growth in the shipped
    playbook; a site that wants the host's pressure first raises its priority."""
    facts = _facts(CLIMBING, swapin_per_s=500)  # host swap, no major fault of the target's
    assert facts["pressure.target_major_faults"] == 0 and facts["memory.shape"] == "climbing"
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("rss-climbing", "growth")
    host_first = _playbook(
        tmp_path,
        ("confidence: 0.4, priority: 10}", "confidence: 0.4, priority: 25}"),
    )
    rule, kind, summary = _verdict(host_first, facts)
    assert (rule, kind) == ("host-memory-pressure", "pressure")
    assert summary.startswith("memory pressure on the host (host-wide counters, seen from PID 500 (orderd))"), summary
    assert "in the window, RSS of PID 500 (orderd) grew" in summary  # beside the pressure, not called its cause


def test_a_site_can_put_stable_above_host_pressure_it_did_not_pay(tmp_path):
    """Once "stable" was whatever Python found no candidate for, so no playbook could rank it above
    host pressure; now it is a rule with a priority like any other."""
    facts = _facts(FLAT, swapin_per_s=500)
    assert facts["pressure.target_major_faults"] == 0
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("host-memory-pressure", "pressure")
    calm = _playbook(tmp_path, ("confidence: 0.6, priority: 1}", "confidence: 0.6, priority: 11}"))
    assert _verdict(calm, facts)[:2] == ("stable", "healthy")


def test_stable_is_a_rule_and_can_be_outranked(tmp_path):
    facts = _facts(FLAT)
    assert "summary.stable" not in facts and "summary.too_few" not in facts  # no verdict text from Python
    rule, kind, summary = _verdict(SHIPPED_RULES, facts)
    assert (rule, kind) == ("stable", "healthy")
    assert summary == "RSS of PID 500 (orderd) is stable at 100 MiB over 20 s; no pressure, no OOM kill"
    # a site that calls every quiet window inconclusive: the floor above stable
    floor_first = _playbook(tmp_path, ("confidence: 0.1, priority: 0}", "confidence: 0.1, priority: 3}"))
    assert _verdict(floor_first, facts)[:2] == ("no-conclusion", "inconclusive")


def test_next_steps_are_given_once_by_key_not_by_text(tmp_path):
    facts = _facts(CLIMBING, swapin_per_s=500, majflt=5)
    fired = [r for r, o in run_rules(SHIPPED_RULES, facts) if o.state == "fired"]
    assert {"memory-pressure", "rss-climbing"} <= {r.id for r in fired}
    steps = advice_of(fired, facts)
    assert len(steps) == len(set(steps))
    # memory-pressure's wording of "find what grows" is kept; host-memory-pressure would say it otherwise
    assert "swap is the symptom: find what grows (memdiag probe faults on the largest consumers)" in steps
    assert "find what grows: page-fault stacks of the largest consumers" not in steps
    assert sum(s.startswith("reclaim and swap as latency: memdiag probe swapin and drsnoop") for s in steps) == 1
    assert steps.index("swap is the symptom: find what grows (memdiag probe faults on the largest consumers)") == 0
    extra = """
  - id: site-a
    when: process.rss > 1MiB
    then: {advice: ["call the on-call", {key: find-what-grows, text: "another wording"}]}
  - id: site-b
    when: process.rss > 1MiB
    then: {advice: ["call the on-call"]}
"""
    rules = _playbook(tmp_path, extra=extra)
    steps = advice_of([r for r, o in run_rules(rules, facts) if o.state == "fired"], facts)
    assert steps.count("call the on-call") == 2  # keyed by rule: two rules, two steps, even in one wording
    assert "another wording" not in steps  # the key was given already


def test_a_keyed_step_is_strict_with_its_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "rules:\n  - id: a\n    when: process.rss > 1MiB\n    then:\n      advice:\n"
        '        - "fine"\n        - {key: k, txt: "typo"}\n        - {key: Bad Key, text: "{proces.rss}"}\n'
    )
    with pytest.raises(RuleFileError) as e:
        load_file(path)
    assert e.value.errors == [
        f"{path}:7: rule a then.advice.1.keyed.text: Field required",
        f"{path}:7: rule a then.advice.1.keyed: unknown key `txt`",
        f"{path}:8: rule a then.advice.2.keyed.key: String should match pattern '^[a-z0-9][a-z0-9_.-]*$'",
    ]


def test_a_target_that_exits_before_the_first_sample_is_said_to_have_exited():
    """No snapshot at all: the fallback rules still see oom.kills and the sample count."""
    obs = Observation(
        target=Target(kind="pid", pid=501, comm="brief", start_ticks=5), requested_s=30, started=T0,
        ended=T0 + 0.2, snapshots=[], oom_kills=[], processes_first={}, processes_last={}, memdiag_pid=4000,
        exited_at=T0 + 0.1,
    )  # fmt: skip
    counters = build_counters(obs)
    facts = counter_facts(obs, counters, 2.0) | {"target.name": obs.target.describe()} | triage(obs, counters).facts
    assert facts["oom.kills"] == 0 and facts["window.samples"] == 0
    rule, kind, summary = _verdict(SHIPPED_RULES, facts)
    assert (rule, kind) == ("exited-too-early", "inconclusive")
    assert summary == "PID 501 (brief) exited before enough samples were taken (0)", summary


def test_the_trail_says_which_fired_verdict_concluded():
    """stable and no-conclusion fire in every window with enough samples: the trail marks them outranked."""
    obs = _obs(FLAT, swapin_per_s=100, majflt=5)
    e = Engine(SHIPPED_RULES, obs.target, 20.0, 2.0)
    result = e.finish(obs, rules_cut=False)
    assert result.verdict.kind == "pressure"
    rules = {t.name: t for t in result.trail if t.kind == "rule"}
    assert rules["memory-pressure"].state == "fired" and "outranked" not in rules["memory-pressure"].reason
    for floor in ("stable", "no-conclusion"):
        assert rules[floor].state == "fired" and rules[floor].reason.endswith("outranked by memory-pressure")
    # a playbook finding carries its rule's id (the report's findings keep psi-stall, swap-in, ... apart)
    assert dict(result.findings)["swap-in"].startswith("pages swapped in 100/s"), result.findings
    assert result.verdict.summary.startswith("memory pressure on the host (host-wide counters, seen from PID 500")
    assert (result.verdict.rule, result.verdict.because) == ("memory-pressure", ["swap-in"])  # in report.json too


def test_the_pressure_verdict_quotes_only_the_signs_that_fired(tmp_path):
    """The summary once listed every figure that moved and MemAvailable, so "MemAvailable 75% of RAM"
    beside a swap storm read like a cause. It quotes the findings of the sign rules that fired: a
    threshold edit adds MemAvailable to it, and nothing in Python chose either."""
    facts = _facts(FLAT, swapin_per_s=100, majflt=5)
    assert facts["system.mem_available_percent"] == 75.0
    rule, kind, summary = _verdict(SHIPPED_RULES, facts)
    assert (rule, kind) == ("memory-pressure", "pressure")
    sign = "pages swapped in 100/s (out: 0/s): the working set no longer fits in memory"
    where = "memory pressure on the host (host-wide counters, seen from PID 500 (orderd))"
    assert summary.startswith(f"{where}: {sign}; paying in major faults: PID 500 (orderd, 105 faults)"), summary
    assert "MemAvailable" not in summary and "PSI" not in summary, summary
    low = "&low-available system.mem_available_percent < "
    wary = _playbook(tmp_path, (low + "10%", low + "80%"))
    summary = _verdict(wary, facts)[2]
    assert summary.startswith(f"{where}: {sign}; MemAvailable is 6.0 GiB (75.0% of RAM); paying"), summary


def test_a_copy_replaces_the_shipped_playbook_only_under_its_name(tmp_path):
    """A site changes shipped policy with an edited copy of default.yaml in its folder; the same
    copy under another name would define every shipped rule twice, and says how to do it."""
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    copy = site / "ours.yaml"
    copy.write_text(SHIPPED)
    copy.chmod(0o644)
    with pytest.raises(RuleFileError) as e:
        load_playbooks(playbook_paths(site=site))
    first = e.value.errors[0]
    assert f"{copy}:11: duplicate rule id `oom-kill`" in first, first
    assert "edit a copy of its file under the same name in the site folder" in first, first
    # linted alone (memdiag rules check FILE), the collision with the shipped rules is named too
    with pytest.raises(RuleFileError) as e:
        load_playbooks([copy], trusted=False)
    assert "(shipped at " in e.value.errors[0] and "under the same name in the site folder" in e.value.errors[0]
    copy.rename(site / "default.yaml")
    rules = load_playbooks(playbook_paths(site=site))
    assert {r.source.split(":")[0] for r in rules if r.id == "oom-kill"} == {str(site / "default.yaml")}


def test_what_paying_for_pressure_means_is_a_yaml_edit(tmp_path):
    """Once a boolean computed in Python (any major fault); now the playbook's target-pays anchor:
    105 major faults with pages in swap pay for the host's swap-in, unless a site asks for more
    than 1000; with nothing in swap (a cold file read faults too) they pay nothing."""
    facts = _facts(FLAT, swapin_per_s=100, majflt=5)
    assert facts["pressure.target_major_faults"] == 105
    assert _verdict(SHIPPED_RULES, facts)[:2] == ("memory-pressure", "pressure")
    paid = '{all: ["pressure.target_major_faults > 0", "pressure.target_swap > 0"]}'
    strict = _playbook(tmp_path, (paid, paid.replace("faults > 0", "faults > 1000")))
    assert _verdict(strict, facts)[:2] == ("host-memory-pressure", "pressure")
    cold = {**facts, "pressure.target_swap": 0}
    assert _verdict(SHIPPED_RULES, cold)[:2] == ("host-memory-pressure", "pressure")


def test_a_healthy_whole_system_says_its_level_is_memavailable():
    """The whole system's level is MemAvailable (6 GiB of 8 here), not memory in use: once the
    verdict read "memory of the whole system is stable at 22.9 GiB" of a host using 8 GiB."""
    obs = _obs(FLAT)
    snaps = [s.model_copy(update={"process": None}) for s in obs.snapshots]
    system = obs.model_copy(
        update={"target": Target(kind="system"), "snapshots": snaps, "processes_first": {}, "processes_last": {}}
    )
    counters = build_counters(system)
    facts = counter_facts(system, counters, 2.0) | {"target.name": system.target.describe()}
    facts |= triage(system, counters).facts
    assert (facts["memory.level"], facts["memory.measure"]) == (6 * GiB, "available memory (MemAvailable)")
    rule, kind, summary = _verdict(SHIPPED_RULES, facts)
    assert (rule, kind) == ("stable", "healthy")
    assert summary == (
        "available memory (MemAvailable) of the whole system is stable at 6.0 GiB over 20 s; no pressure, no OOM kill"
    )


def test_a_healthy_verdict_names_no_culprit_and_its_report_has_no_culprit_line():
    """A flat RSS concludes healthy: nothing is to blame, so no Culprit line (it once said
    "Culprit: PID 500 (orderd)" under "stable at 100 MiB"); a climbing one still names the target."""
    from memdiag.diagnose.culprit import default_classes
    from memdiag.diagnose.render.markdown import _culprit_lines
    from memdiag.diagnose.verdict import verdict_of

    obs = _obs(FLAT)
    counters = build_counters(obs)
    tri = triage(obs, counters)
    facts = counter_facts(obs, counters, 2.0) | {"target.name": obs.target.describe()} | tri.facts
    _, verdict = verdict_of(run_rules(SHIPPED_RULES, facts), facts, obs.target, tri, {}, default_classes())
    assert verdict.kind == "healthy" and verdict.culprit.pid is None and verdict.culprit.function is None
    assert _culprit_lines(verdict.culprit) == []
    climbing = _obs(CLIMBING)
    counters = build_counters(climbing)
    tri = triage(climbing, counters)
    facts = counter_facts(climbing, counters, 2.0) | {"target.name": climbing.target.describe()} | tri.facts
    _, verdict = verdict_of(run_rules(SHIPPED_RULES, facts), facts, climbing.target, tri, {}, default_classes())
    assert verdict.kind == "growth" and (verdict.culprit.pid, verdict.culprit.comm) == (500, "orderd")
    assert _culprit_lines(verdict.culprit) == ["- Culprit: PID 500 (orderd)"]
