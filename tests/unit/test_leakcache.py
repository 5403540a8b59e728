"""Leak, cache or neither from one stack's series alone (no reachability scan): the facts are
computed in Python (probes/memleak/trend.py), the judgment is the shipped playbook's (its trend-leak
and trend-cache anchors), and a site moves the line with a YAML edit."""

import pytest
from memdiag.probes.memleak.trend import stack_trend
from memdiag.rules.engine import conclude, run_rules
from memdiag.rules.loader import load_playbooks, playbook_paths, shipped_playbooks

MiB = 1 << 20
T = [float(t) for t in range(0, 21, 2)]
SHIPPED = load_playbooks(shipped_playbooks())


def _facts(times, series, alloc, freed, rss_shape):
    tr = stack_trend(times, series, alloc, freed)
    return {
        "target.kind": "pid", "target.name": "PID 1 (x)", "budget.percent": 2.0, "summary.growth": "grows",
        "reach.scanned": False, "reach.not_run_reason": "over budget", "process.rss_shape": rss_shape,
        "memleak.top_trend": tr.shape, "memleak.top_rate": tr.rate_per_s,
        "memleak.top_free_ratio": 100 * tr.free_ratio if tr.free_ratio is not None else None,
        "memleak.top_outstanding": series[-1], "memleak.top_function": "f", "memleak.top_entry": "malloc",
    }  # fmt: skip


def _judged(facts, rules=SHIPPED) -> str | None:
    fired = {r.id for r, o in run_rules(rules, facts) if o.state == "fired"}
    shapes = fired & {"unfreed-unscanned", "cache-confirmed"}
    assert len(shapes) <= 1, shapes
    return next(iter(shapes), None)


def test_climbs_frees_little_and_rss_climbs_is_growth_that_names_the_missing_scan():
    series = [int(t * MiB) for t in T]
    facts = _facts(T, series, series[-1], 0, "climbing")
    assert facts["memleak.top_trend"] == "climbing" and abs(facts["memleak.top_rate"] - MiB) < 0.05 * MiB
    assert _judged(facts) == "unfreed-unscanned"
    c = conclude(run_rules(SHIPPED, facts), facts)
    # the trend cannot tell a dropped block from a kept one (a registry climbs and frees nothing too)
    assert c.winner.id == "unfreed-unscanned" and c.winner.then.verdict.kind == "growth", c.summary
    assert "leaked or still held, which only the reachability scan tells" in c.summary


def test_cache_levels_off():
    series = [int(min(t, 6) * 4 * MiB) for t in T]
    assert _judged(_facts(T, series, 40 * MiB, 16 * MiB, "levelled")) == "cache-confirmed"


def test_turnover_of_a_full_cache_is_not_a_leak():
    # tracked blocks replace ones allocated before the probe: outstanding climbs, RSS does not
    series = [int(t * MiB) for t in T]
    assert _judged(_facts(T, series, series[-1], 0, "flat")) is None


def test_churn_at_a_bound_is_a_cache():
    series = [8 * MiB] * len(T)
    assert _judged(_facts(T, series, 100 * MiB, 99 * MiB, "flat")) == "cache-confirmed"


def test_too_few_samples_is_neither():
    facts = _facts([0.0, 2.0], [0, MiB], MiB, 0, "climbing")
    assert facts["memleak.top_trend"] == "unknown" and _judged(facts) is None


def test_the_freed_share_that_makes_a_leak_is_a_yaml_edit(tmp_path):
    """Frees 60% of what it allocates, outstanding and RSS climbing: growth to the shipped line
    (under half freed), a leak to a site that draws it at 70%."""
    series = [int(t * MiB) for t in T]
    facts = _facts(T, series, 50 * MiB, 30 * MiB, "climbing")
    assert facts["memleak.top_free_ratio"] == pytest.approx(60.0) and _judged(facts) is None
    site = tmp_path / "site"
    site.mkdir(mode=0o755)
    text = shipped_playbooks()[0].read_text()
    assert text.count("- memleak.top_free_ratio < 50%") == 1
    (site / "default.yaml").write_text(text.replace("- memleak.top_free_ratio < 50%", "- memleak.top_free_ratio < 70%"))
    assert _judged(facts, load_playbooks(playbook_paths(site=site))) == "unfreed-unscanned"
