"""The rule language and the shipped playbook, on fixture facts (no kernel)."""

from pathlib import Path

import pytest
from memdiag.rules.engine import conclude, render, run_rule, run_rules
from memdiag.rules.loader import RuleFileError, load_file, load_playbooks, shipped_playbooks
from memdiag.system.units import parse_quantity

MiB = 1 << 20


def _file(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _errors(tmp_path, text) -> list[str]:
    with pytest.raises(RuleFileError) as e:
        load_file(_file(tmp_path, text))
    return e.value.errors


def test_quantities():
    assert parse_quantity("64MiB") == (64 * MiB, "bytes")
    assert parse_quantity("1MiB/s") == (MiB, "bytes_per_s")
    assert parse_quantity("60MiB/min") == (MiB, "bytes_per_s")
    assert parse_quantity("1000/s") == (1000, "per_s")
    assert parse_quantity("5%") == (5, "percent")
    assert parse_quantity("5min") == (300, "seconds")
    for ambiguous in ("2m", "2M", "2m/s"):  # it was 2 MiB where the rule docs promised minutes
        with pytest.raises(ValueError, match="'m' is ambiguous: write 2min for a duration or 2MiB for a size"):
            parse_quantity(ambiguous)
    assert parse_quantity("30s") == (30, "seconds")
    assert parse_quantity("climbing") == ("climbing", "string")
    with pytest.raises(ValueError, match="unknown unit"):
        parse_quantity("5parsecs")


def test_an_ambiguous_m_in_a_rule_file_is_refused_with_its_line(tmp_path):
    errs = _errors(tmp_path, "rules:\n  - id: f\n    when: process.rss_growth > 5m\n    then: {finding: x}\n")
    assert len(errs) == 1 and ":3:" in errs[0] and "write 5min for a duration or 5MiB for a size" in errs[0], errs


def test_shipped_playbook_loads_with_sources():
    rules = load_playbooks(shipped_playbooks())
    assert {"oom-kill", "memory-pressure", "rss-climbing", "unfreed-unscanned", "cache-confirmed", "stable"} <= {
        r.id for r in rules
    }
    assert all(r.source.split(":")[-1].isdigit() for r in rules)


def test_unknown_fact_with_suggestion_and_line(tmp_path):
    errs = _errors(tmp_path, "rules:\n  - id: a\n    when: proces.rss > 1GiB\n    then: {finding: x}\n")
    assert errs == [f"{tmp_path / 'r.yaml'}:3: rule a when: unknown fact `proces.rss`; did you mean `process.rss`?"]


def test_a_removed_fact_says_which_rule_decides_now(tmp_path):
    """A site playbook written against the Python-decided verdicts: one line naming the rule that replaced it."""
    errs = _errors(tmp_path, "rules:\n  - id: a\n    when: {present: summary.stable}\n    then: {finding: x}\n")
    assert errs == [
        f"{tmp_path / 'r.yaml'}:3: rule a when.present: fact `summary.stable` was removed: the shipped rule `stable` "
        "decides it (window.samples, memory.shape)"
    ], errs


def test_a_probe_is_given_its_options_only_from_known_facts(tmp_path):
    """`given` maps a probe's own option to a fact: an option the probe does not have, or a fact the
    catalog does not know, is one line with the file and the rule's line."""
    rule = "rules:\n  - id: g\n    when: process.rss > 1GiB\n    then:\n      probes: [{name: %s, given: {%s: %s}}]\n"
    ok = load_file(_file(tmp_path, rule % ("sites", "function", "faults.top_function")))
    assert ok[0].then.probes[0].given == {"function": "faults.top_function"}
    errs = _errors(tmp_path, rule % ("faults", "function", "faults.top_function"))
    assert (
        len(errs) == 1
        and "rule g then.probes.0: probe faults has no option `function` (its options: none)" in (errs[0])
    )
    errs = _errors(tmp_path, rule % ("sites", "fn", "faults.top_function"))
    assert len(errs) == 1 and "probe sites has no option `fn` (its options: function)" in errs[0], errs
    errs = _errors(tmp_path, rule % ("sites", "function", "faults.top_fn"))
    assert len(errs) == 1 and "unknown fact `faults.top_fn`; did you mean `faults.top_function`?" in errs[0], errs


def test_a_probe_is_aimed_at_a_process_only_by_a_known_fact(tmp_path):
    """`process` names the fact that gives the process of a cgroup target a probe runs on: checked
    against the catalog at load like `given`."""
    rule = "rules:\n  - id: p\n    when: target.kind == cgroup\n    then:\n"
    rule += "      probes: [{name: memleak, process: %s}]\n"
    ok = load_file(_file(tmp_path, rule % "cgroup.top_grower_pid"))
    assert ok[0].then.probes[0].process == "cgroup.top_grower_pid"
    errs = _errors(tmp_path, rule % "cgroup.top_grower")
    assert len(errs) == 1 and "unknown fact `cgroup.top_grower`" in errs[0], errs


def test_unit_mismatch_unknown_key_missing_then(tmp_path):
    errs = _errors(tmp_path, "rules:\n  - id: b\n    when: process.rss > 5%\n    thne: {finding: x}\n")
    text = "\n".join(errs)
    assert ":3: rule b when: fact `process.rss` is a size (e.g. 64MiB); '5%' is a percentage" in text
    assert ":4: rule b: unknown key `thne`" in text
    assert "rule b then: Field required" in text


def test_bad_yaml_and_empty_and_wrong_shape(tmp_path):
    err = _errors(tmp_path, "rules:\n  - id: c\n    when: [unclosed\n")[0]
    assert ":4: not valid YAML: " in err and "expected ',' or ']'" in err and "flow sequence on line 3" in err
    assert ":1: empty file" in _errors(tmp_path, "")[0]
    assert "`rules` (a list of rules) and/or `wrappers`" in _errors(tmp_path, "- id: d\n")[0]
    assert (
        "`then` needs at least one of"
        in _errors(tmp_path, "rules:\n  - id: e\n    when: process.rss > 1\n    then: {}\n")[0]
    )


def test_template_and_string_facts_are_checked(tmp_path):
    errs = _errors(tmp_path, "rules:\n  - id: f\n    when: process.rss_shape > climbing\n    then: {finding: x}\n")
    text = "\n".join(errs)
    assert "only == and != apply" in text


def test_duplicate_ids_across_files(tmp_path):
    a = _file(tmp_path, "rules:\n  - id: same\n    when: process.rss > 1\n    then: {finding: a}\n", "a.yaml")
    b = _file(tmp_path, "rules:\n  - id: same\n    when: process.rss > 2\n    then: {finding: b}\n", "b.yaml")
    with pytest.raises(RuleFileError) as e:
        load_playbooks([a, b])
    assert e.value.errors == [f"{b}:2: duplicate rule id `same` (first defined at {a}:2)"]


def test_three_valued_outcomes(tmp_path):
    (rule,) = load_file(
        _file(
            tmp_path,
            "rules:\n  - id: g\n    when: {all: ['process.rss > 1MiB', "
            "'process.swap > 0']}\n    then: {finding: 'rss {process.rss}'}\n",
        )
    )
    assert run_rule(rule, {"process.rss": 2 * MiB, "process.swap": 4096}).state == "fired"
    assert run_rule(rule, {"process.rss": 512, "process.swap": None}).state == "not-fired"  # false decides
    skipped = run_rule(rule, {"process.rss": 2 * MiB, "process.swap": None})
    assert skipped.state == "skipped" and skipped.reason == "missing process.swap"
    broken = run_rule(rule, {"process.rss": "not a number", "process.swap": 1})
    assert broken.state == "error" and "TypeError" in broken.reason
    assert render(rule.then.finding, {"process.rss": 3 * MiB}) == "rss 3.0 MiB"


def _verdicts(facts: dict) -> list[str]:
    rules = load_playbooks(shipped_playbooks())
    fired = [r for r, o in run_rules(rules, facts) if o.state == "fired" and r.then.verdict]
    fired.sort(key=lambda r: r.then.verdict.priority, reverse=True)
    return [r.then.verdict.kind for r in fired]


BASE = {
    "target.kind": "pid", "budget.percent": 2.0, "summary.growth": "grows", "target.name": "PID 1 (x)",
    "target.runtime": "none",  # every fact set has it (diagnose/factset.py)
}  # fmt: skip


def test_playbook_a_climbing_stack_beats_the_counters_growth_and_without_a_scan_is_no_leak():
    facts = {
        **BASE,
        "reach.scanned": False,
        "reach.not_run_reason": "over budget",
        "process.rss_shape": "climbing",
        "memleak.top_trend": "climbing",
        "memleak.top_free_ratio": 0.0,
        "memleak.top_entry": "malloc",
        "memleak.top_function": "f",
        "memleak.top_rate": 1.0,
        "memleak.top_outstanding": 1,
    }
    rules = load_playbooks(shipped_playbooks())
    fired = [r for r, o in run_rules(rules, facts) if o.state == "fired" and r.then.verdict]
    assert max(fired, key=lambda r: r.then.verdict.priority).id == "unfreed-unscanned"
    assert "leak" not in _verdicts(facts) and "rss-climbing" in {r.id for r in fired}


def test_playbook_cache_and_mappings():
    facts = {
        **BASE,
        "process.rss_shape": "levelled",
        "summary.plateau": "p",
        "reach.scanned": False,
        "memleak.top_trend": "levelled",
        "memleak.top_function": "c",
        "memleak.top_outstanding": 1,
    }
    assert _verdicts(facts)[0] == "cache"
    facts = {
        **BASE,
        "process.rss_shape": "climbing",
        "memleak.top_trend": "climbing",
        "memleak.top_free_ratio": 0.0,
        "memleak.top_entry": "mmap",
        "memleak.top_function": "m",
        "memleak.top_rate": 1.0,
        "memleak.top_outstanding": 1,
    }
    assert _verdicts(facts)[0] == "growth"
    assert _winner({**facts, "reach.scanned": False})[0] == "mappings-never-unmapped"
    # under Python code the interpreter maps (pymalloc's arenas): said so, never "handle_order maps"
    python = {**facts, "reach.scanned": False, "target.runtime": "cpython", "target.python_frames": "read",
              "memleak.top_function": "handle_order (app.py:12)"}  # fmt: skip
    rule, _, summary = _winner(python)
    assert rule == "python-memory-never-unmapped", summary
    assert "the Python objects handle_order (app.py:12) makes are kept" in summary and "maps anonymous" not in summary


def _winner(facts: dict):
    c = conclude(run_rules(load_playbooks(shipped_playbooks()), facts), facts)
    return c.winner.id, c.winner.then.verdict.confidence, c.summary


SCANNED = {
    **BASE,
    "reach.scanned": True,
    "memleak.top_function": "f",
    "memleak.top_entry": "malloc",
    "memleak.top_rate": 1000.0,
    "memleak.top_outstanding": 4 * MiB,
    "memory.shape_while_traced": "climbing",
}


def test_playbook_leak_by_reachability_even_when_the_stack_frees_most():
    facts = {
        **SCANNED,
        "process.rss_shape": "climbing",
        "memleak.top_free_ratio": 86.0,  # frees 6 in 7: the shape alone never said leak
        "memleak.top_trend": "climbing",
        "reach.leaked_count": 300,
        "reach.leaked_bytes": 300 * 1024,
        "reach.unreferenced_count": 300,
        "reach.leaked_ratio": 99.0,
        "reach.leak_function": "process_order",
        "reach.leak_share": "1 in 7 allocations",
        "reach.leak_rate": 1024.0,
        "reach.anchored_ratio": 1.0,
    }
    rule, confidence, summary = _winner(facts)
    assert rule == "leak-unreachable" and confidence == 0.9
    assert summary.startswith("PID 1 (x) leaks from process_order: 1 in 7 allocations is never freed")


@pytest.mark.parametrize(
    "leaked, allocs, frees, share",
    [
        (4, 5, 1, "nearly every allocation (4 of 5)"),  # once "every allocation" beside a stack showing a free
        (5, 5, 0, "every allocation"),
        (5, 5, 1, "nearly every allocation (4 of 5)"),  # no more leaked than was not freed
        (300, 2100, 1800, "1 in 7 allocations"),
        (0, 5, 5, None),
    ],
)
def test_the_leak_share_says_every_allocation_only_when_none_was_freed(leaked, allocs, frees, share):
    from memdiag.probes.memleak.facts import share_words

    assert share_words(leaked, allocs, frees) == share
    if share is None:
        return
    facts = {
        **SCANNED,
        "process.rss_shape": "climbing",
        "memleak.top_trend": "climbing",
        "reach.leaked_count": leaked,
        "reach.leaked_bytes": leaked * 1024,
        "reach.unreferenced_count": leaked,
        "reach.leaked_ratio": 99.0,
        "reach.leak_function": "process_order",
        "reach.leak_share": share,
        "reach.leak_rate": 1024.0,
        "reach.anchored_ratio": 1.0,
    }
    summary = _winner(facts)[2]
    assert summary.startswith(f"PID 1 (x) leaks from process_order: {share} is never freed and nothing points at it")


def test_playbook_held_growth_and_held_cache_are_not_leaks():
    held = {
        **SCANNED,
        "memleak.top_free_ratio": 0.0,  # frees nothing and climbs: the shape alone said leak
        "reach.leaked_count": 0,
        "reach.leaked_ratio": 0.0,
        "reach.anchored_bytes": 4 * MiB,
        "reach.anchored_ratio": 100.0,
        "reach.anchor": "`registry` in registry's .bss",
        "reach.anchor_kind": "static",
        "alloc.allocator": "glibc",
    }
    rule, _, summary = _winner({**held, "process.rss_shape": "climbing", "memleak.top_trend": "climbing"})
    assert rule == "growth-held" and "reachable from `registry` in registry's .bss" in summary
    rule, _, _ = _winner({**held, "process.rss_shape": "flat", "memleak.top_trend": "climbing"})
    assert rule == "cache-held"  # tracked blocks replace older ones: RSS does not move
    rule, _, _ = _winner({**held, "process.rss_shape": "climbing", "memleak.top_trend": "levelled"})
    assert rule == "cache-held"
    # a cache full before the trace: the window's memory levelled, flat while traced, the traced
    # blocks (new entries) climbing as they replace untraced ones
    traced_flat = {**held, "process.rss_shape": "levelled", "memory.shape_while_traced": "flat"}
    rule, _, _ = _winner({**traced_flat, "memleak.top_trend": "climbing"})
    assert rule == "cache-held"
    # a trace the budget cut short of a trend (twistd, 2.2 s): what the stack did while traced, held
    rule, confidence, summary = _winner({**held, "process.rss_shape": "climbing"})
    assert rule == "growth-held-short-trace" and confidence < 0.85, summary
    assert summary.startswith("PID 1 (x): f added blocks the program still holds (4.0 MiB reachable from `registry`")
    rule, _, _ = _winner({**held, "process.rss_shape": "climbing", "memleak.top_free_ratio": 90.0})
    assert rule != "growth-held-short-trace"  # freeing most of it while traced: turnover, no growth shown


def test_playbook_a_go_heap_arena_mapped_by_the_runtime_is_no_cache_nor_held_growth():
    """Under Go, memleak's mmap stack is the runtime mapping its heap (x_cgo_mmap under runtime.sysMap):
    one arena, flat and pointed at from the runtime's globals, said nothing of a growing map (a
    trial's Go service came out cache at 85%). A C allocation through cgo is still judged."""
    arena = {
        **SCANNED,
        "target.runtime": "go",
        "memleak.top_entry": "mmap",
        "memleak.top_free_ratio": 0.0,
        "reach.leaked_count": 0,
        "reach.leaked_ratio": 0.0,
        "reach.anchored_bytes": 4 * MiB,
        "reach.anchored_ratio": 100.0,
        "reach.anchor": "`net/http.headerSorterPool` in sessiond's .data",
        "reach.anchor_kind": "static",
        "alloc.allocator": "glibc",
        "process.rss_shape": "climbing",
    }
    for trend in ("levelled", "climbing"):
        rule, _, summary = _winner({**arena, "memleak.top_trend": trend})
        assert rule not in ("cache-held", "growth-held", "growth-held-by-untracked"), summary
    rule, _, _ = _winner({**arena, "memleak.top_trend": "levelled", "memleak.top_entry": "malloc"})
    assert rule == "cache-held"  # a C allocation the Go program made through cgo


def test_playbook_without_a_scan_falls_back_to_the_trend_with_less_confidence():
    facts = {
        **SCANNED,
        "reach.scanned": False,
        "reach.not_run_reason": "a 1 GiB scan would pause the target 600 ms > 300 ms the budget allows",
        "process.rss_shape": "climbing",
        "memleak.top_trend": "climbing",
        "memleak.top_free_ratio": 0.0,
    }
    rule, confidence, summary = _winner(facts)
    assert rule == "unfreed-unscanned" and confidence < 0.9
    # the scan's price stays in the trail: its figures are no table's, and a headline is no place for them
    assert "which only the reachability scan tells, and it did not run (the reason is in the trail)" in summary
    assert "600 ms" not in summary


def test_playbook_oom_and_pressure_precedence():
    paid = {
        "pressure.target_major_faults": 5,
        "pressure.target_swap": 1 << 20,
        "summary.pressure_context": "p",
        "pressure.where": "w",
    }
    facts = {**BASE, **paid, "oom.kills": 1, "summary.oom": "killed", "system.psi_some": 50.0}
    assert _verdicts({**facts, "oom.kills_in_window": 1})[:2] == ["oom", "pressure"]
    # a kill from before the window (a reused cgroup, a restarted service) comes after what is seen now
    assert _verdicts({**facts, "oom.kills_in_window": 0})[:2] == ["pressure", "oom"]
    assert _verdicts({**BASE, **paid, "system.swapin_rate": 500.0})[0] == "pressure"


def test_playbook_host_pressure_the_target_did_not_pay_comes_after_its_growth():
    """Swap-in is the host's figure: a target that took no major fault and hit no limit of its own
    is diagnosed by what was seen in it (growth), the host's pressure after it (the loop test saw a
    leak called 'pressure' from another test's swap)."""
    host = {
        "pressure.target_major_faults": 0,
        "summary.pressure_context": "p",
        "pressure.where": "w",
        "system.swapin_rate": 500.0,
    }
    growing = {"process.rss_shape": "climbing", "process.rss_rate": 1e6, "summary.growth": "grows"}
    assert _verdicts({**BASE, **host, **growing})[0] == "growth"
    assert _verdicts({**BASE, **host})[0] == "pressure"  # nothing else seen: the host's pressure, said as such


def test_playbook_healthy_when_stable():
    facts = {**BASE, "process.rss_shape": "flat", "memory.shape": "flat", "window.samples": 30}
    assert _verdicts(facts) == ["healthy", "inconclusive"]  # stable, then the floor (no-conclusion)
    assert _verdicts({**facts, "window.samples": 2, "oom.kills": 0}) == ["inconclusive", "inconclusive"]


VERDICT = "verdict: {kind: pressure, summary: 'S', confidence: 0.5, priority: 5"


def test_a_verdicts_because_is_checked_when_loaded(tmp_path):
    """`because` quotes the findings of rules by id: each must exist (here or shipped) and have a
    finding, and the summary must quote {because} exactly when the list is there."""
    head = "rules:\n  - id: v\n    when: oom.kills > 0\n    then:\n      "
    path = _file(tmp_path, head + VERDICT.replace("'S'", "'on {target.name}: {because}'") + ", because: [swap-inn]}\n")
    with pytest.raises(RuleFileError) as e:
        load_playbooks([path])
    assert e.value.errors == [f"{path}:2: rule v verdict.because: no rule `swap-inn`; did you mean `swap-in`?"]

    path = _file(tmp_path, head + VERDICT.replace("'S'", "'{because}'") + ", because: [memleak-over-budget]}\n")
    with pytest.raises(RuleFileError) as e:
        load_playbooks([path])
    assert len(e.value.errors) == 1 and "rule `memleak-over-budget` has no finding to quote (" in e.value.errors[0]

    errs = _errors(tmp_path, head + VERDICT.replace("'S'", "'{because}'") + "}\n")
    assert len(errs) == 1 and ":5:" in errs[0] and "list the rules it quotes in `because`" in errs[0], errs
    errs = _errors(tmp_path, head + VERDICT + ", because: [swap-in]}\n")
    assert len(errs) == 1 and "put {because} in the summary" in errs[0], errs
    errs = _errors(tmp_path, head + "finding: 'x {because}'\n")
    assert len(errs) == 1 and "{because} quotes other rules' findings: only a verdict's summary may" in errs[0], errs
    errs = _errors(tmp_path, head + VERDICT.replace("'S'", "'{because}'") + ", because: [swap-in, swap-in]}\n")
    assert len(errs) == 1 and "`because` names a rule twice" in errs[0], errs

    # a site file quoting the shipped sign rules loads with the shipped playbook, and lints alone
    good = _file(tmp_path, head + VERDICT.replace("'S'", "'{because}'") + ", because: [swap-in, host-psi-stall]}\n")
    assert load_playbooks([*shipped_playbooks(), good])[-1].then.verdict.because == ["swap-in", "host-psi-stall"]
    assert load_playbooks([good])[0].id == "v"


def test_a_because_with_nothing_fired_quotes_the_facts_that_decided(tmp_path):
    """A site verdict whose own condition is not one of its `because` rules' (swap-in fires over
    64/s, the site's at 16/s): the summary names the facts that decided, never rule ids."""
    site = _file(
        tmp_path,
        "rules:\n  - id: site-swap\n    when: system.swapin_rate > 16/s\n    then:\n      "
        + VERDICT.replace("'S'", "'swap on {target.name}: {because}'").replace("priority: 5", "priority: 500")
        + ", because: [swap-in]}\n",
    )
    facts = {**BASE, "system.swapin_rate": 30.0}
    c = conclude(run_rules(load_playbooks([*shipped_playbooks(), site]), facts), facts)
    assert (c.winner.id, c.summary) == ("site-swap", "swap on PID 1 (x): system.swapin_rate = 30/s"), c.summary


def test_render_substitutes_once():
    """A value holding braces (a process named `{target.name}`) is shown as it is."""
    facts = {"target.name": "PID 1 ({pressure.where})", "pressure.where": "X"}
    assert render("on {target.name} at {pressure.where}", facts) == "on PID 1 ({pressure.where}) at X"


def test_because_quotes_the_fired_findings_in_the_verdicts_order():
    rules = load_playbooks(shipped_playbooks())
    facts = {
        **BASE,
        "pressure.target_major_faults": 5,
        "pressure.target_swap": 1 << 20,
        "pressure.where": "cgroup /app",
        "summary.pressure_context": "c",
    }
    facts |= {"system.psi_some": 30.0, "system.psi_full": 1.0, "system.direct_reclaim_rate": 2.0}
    c = conclude(run_rules(rules, facts), facts)
    assert c.winner.id == "memory-pressure"
    assert c.summary == (
        "memory pressure on cgroup /app: tasks stalled on memory 30.0% of the window (the host's PSI some; full 1.0%); "
        "allocations stalled in direct reclaim 2/s; c"
    ), c.summary


def test_held_only_by_memory_of_unknown_use_is_not_called_held_under_jemalloc():
    """jemalloc's thread caches keep stale addresses of regions handed out again: an error-branch
    leak scanned all 'anchored' from its anonymous memory (the trial's leaky2; glibc: leaked)."""
    facts = {
        **SCANNED,
        "process.rss_shape": "climbing",
        "memleak.top_trend": "climbing",
        "memleak.top_free_ratio": 75.0,
        "reach.leaked_count": 0,
        "reach.leaked_ratio": 0.0,
        "reach.anchored_bytes": 2 * MiB,
        "reach.anchored_ratio": 100.0,
        "reach.anchor": "memory memdiag did not see allocated (anonymous memory at 0x7f5271280000)",
        "reach.anchor_kind": "untracked",
    }
    rule, confidence, summary = _winner({**facts, "alloc.allocator": "jemalloc"})
    assert (rule, confidence) == ("growth-held-by-untracked", 0.5), summary
    assert "a held structure or a leak the allocator's stale pointers hide" in summary and "not a leak" not in summary
    rule, confidence, summary = _winner({**facts, "alloc.allocator": "glibc"})  # a Python list's objects, so
    assert (rule, confidence) == ("growth-held", 0.85) and summary.endswith("an unbounded structure, not a leak")


def test_a_process_beside_a_greedy_one_does_not_pay_for_its_cgroups_limit():
    """The trial's idle memcached in a 64 MiB cgroup a file reader kept at its limit: the limit hits
    are the cgroup's, the pid took no major fault, so the pressure is not put on it."""
    facts = {
        **BASE,
        "cgroup.limit_hits": 29180,
        "cgroup.usage_percent": 99.6,
        "pressure.target_major_faults": 0,
        "pressure.target_swap": 0,
        "pressure.where": "w",
        "summary.pressure_context": "c",
    }
    assert _verdicts(facts)[0] == "pressure" and _winner(facts)[0] == "host-memory-pressure"
    assert _winner({**facts, "pressure.target_major_faults": 5})[0] == "memory-pressure"
    assert _winner({**facts, "target.kind": "cgroup"})[0] == "memory-pressure"  # a cgroup target pays its own


def test_pages_touched_name_the_growth_before_address_space_mapped():
    """The trial's jemalloc leaker over budget: mmapsnoop saw one 32 MiB reservation from whichever
    caller was there (churn), the faults probe the code touching the new pages (build_record)."""
    facts = {**BASE, "process.rss_shape": "climbing", "mmap.anon_bytes": 32 * MiB, "mmap.top_function": "churn"}
    assert _winner(facts)[0] == "anonymous-mappings-grow"
    rule, _, summary = _winner({**facts, "faults.top_function": "build_record"})
    assert rule == "growth-named-by-faults" and summary.endswith("the new pages are touched by build_record")


def test_next_steps_never_ask_to_run_what_already_ran():
    rules = load_playbooks(shipped_playbooks())
    climbing = {**BASE, "process.rss_shape": "climbing"}

    def steps(extra: dict) -> str:
        facts = {**climbing, **extra}
        return " | ".join(conclude(run_rules(rules, facts), facts).advice)

    nothing = steps({})
    assert "(faults probe)" in nothing and "(memleak probe)" in nothing and "(brkstack, mmapsnoop)" in nothing
    ran = steps({"faults.top_function": "f", "memleak.top_trend": "climbing", "mmap.top_function": "g"})
    assert "(faults probe)" not in ran and "(memleak probe)" not in ran and "(brkstack, mmapsnoop)" not in ran
    assert "(brkstack, mmapsnoop)" not in steps({"brk.top_function": "h"})
    # once the code and what keeps its memory are named, no stack of pages or mappings is asked for
    for named in ({"memleak.top_trend": "climbing", "reach.scanned": True}, {"jfr.held_site": "A.f() line: 9"},
                  {"go.top_function": "main.f"}):  # fmt: skip
        said = steps(named)
        assert "(faults probe)" not in said and "(brkstack, mmapsnoop)" not in said, named
    unscanned = steps({"memleak.top_trend": "climbing", "reach.scanned": False})  # the holder unknown: still asked
    assert "(faults probe)" in unscanned and "(brkstack, mmapsnoop)" in unscanned
    assert "(memleak probe)" not in steps({"target.runtime": "go"})  # Go's heap: no malloc probe sees it


def test_a_node_growth_held_by_javascript_objects_advises_a_heap_snapshots_retainers():
    rules = load_playbooks(shipped_playbooks())
    facts = {
        **BASE, "target.runtime": "node", "process.rss_shape": "climbing", "memory.shape_while_traced": "climbing",
        "memleak.top_trend": "climbing", "memleak.top_function": "rememberFailure", "memleak.top_rate": 1000.0,
        "memleak.top_entry": "malloc", "reach.scanned": True, "reach.anchored_ratio": 100.0,
        "reach.anchored_bytes": 10 << 20, "reach.anchor": "JavaScript objects in V8's heap",
        "reach.anchor_kind": "runtime", "alloc.allocator": "glibc",
    }  # fmt: skip
    c = conclude(run_rules(rules, facts), facts)
    assert c.winner.id == "growth-held" and "reachable from JavaScript objects in V8's heap" in c.summary, c.summary
    steps = " | ".join(c.advice)
    assert "heap snapshot's retainers" in steps and "rememberFailure allocates" in steps and "never SIGUSR1" in steps
    python = {**facts, "target.runtime": "cpython", "reach.anchor": "`__main__.failed` (a list)"}
    assert "heap snapshot" not in " | ".join(conclude(run_rules(rules, python), python).advice)
