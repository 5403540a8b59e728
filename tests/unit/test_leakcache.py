"""Leak, cache or growth for one stack's series (memleak) — the decision rules on synthetic data."""

from memdiag.diagnose.leakcache import classify

MiB = 1 << 20
T = [float(t) for t in range(0, 21, 2)]


def test_leak_climbs_frees_little_and_rss_climbs():
    series = [int(t * MiB) for t in T]
    r = classify(T, series, alloc_bytes=series[-1], freed_bytes=0, process_shape="climbing")
    assert r.shape == "leak" and abs(r.rate_per_s - MiB) < 0.05 * MiB and r.confidence > 0.6


def test_cache_levels_off():
    series = [int(min(t, 6) * 4 * MiB) for t in T]
    r = classify(T, series, alloc_bytes=40 * MiB, freed_bytes=16 * MiB, process_shape="levelled")
    assert r.shape == "cache"


def test_turnover_of_a_full_cache_is_not_a_leak():
    # tracked blocks replace ones allocated before the probe: outstanding climbs, RSS does not
    series = [int(t * MiB) for t in T]
    r = classify(T, series, alloc_bytes=series[-1], freed_bytes=0, process_shape="flat")
    assert r.shape == "growth" and "does not climb" in r.reason


def test_churn_at_a_bound_is_a_cache():
    series = [8 * MiB] * len(T)
    r = classify(T, series, alloc_bytes=100 * MiB, freed_bytes=99 * MiB, process_shape="flat")
    assert r.shape == "cache"


def test_too_few_samples_is_growth_to_watch():
    r = classify([0.0, 2.0], [0, MiB], alloc_bytes=MiB, freed_bytes=0, process_shape="climbing")
    assert r.shape == "growth" and r.watch_more_s >= 10
