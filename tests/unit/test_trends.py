"""Trend shapes on synthetic series: what 'still climbing' and 'levelled off' mean."""

import random

from memdiag.system.trends import counter_rate, growth_trend

MiB = 1 << 20


def _noise(seed):
    rng = random.Random(seed)
    return lambda: rng.uniform(-64 * 1024, 64 * 1024)


def test_steady_leak_is_climbing():
    n = _noise(1)
    tr = growth_trend([(t, 10 * MiB + 2 * MiB * t + n()) for t in range(31)])
    assert tr.shape == "climbing"
    assert abs(tr.rate_per_s - 2 * MiB) < 0.05 * MiB


def test_slow_leak_above_the_noise_is_climbing():
    tr = growth_trend([(t, 100 * MiB + 40 * 1024 * t) for t in range(31)])  # 40 KiB/s
    assert tr.shape == "climbing"


def test_fill_then_plateau_is_levelled():
    n = _noise(2)
    tr = growth_trend([(t, 5 * MiB + min(t, 8) * 8 * MiB + n()) for t in range(31)])
    assert tr.shape == "levelled"
    assert tr.levelled_for_s >= 20


def test_decelerating_growth_levels_off():
    # growth slowing to a trickle (a cache's last entries) counts as levelled once under a quarter of its pace
    tr = growth_trend([(t, 64 * MiB * (1 - 0.7**t)) for t in range(31)])
    assert tr.shape == "levelled"


def test_jitter_is_flat():
    n = _noise(3)
    tr = growth_trend([(t, 50 * MiB + n()) for t in range(31)])
    assert tr.shape == "flat"


def test_release_is_shrinking():
    tr = growth_trend([(t, 100 * MiB - 2 * MiB * t) for t in range(31)])
    assert tr.shape == "shrinking"


def test_too_few_points_is_unknown():
    assert growth_trend([(0, 1.0), (1, 2.0)]).shape == "unknown"
    assert growth_trend([]).shape == "unknown"


def test_counter_rate():
    assert counter_rate(100, 400, 3.0) == 100.0
    assert counter_rate(None, 5, 1.0) is None
    assert counter_rate(1000, 10, 2.0) == 5.0  # counter reset: count from zero


def test_oom_loop_is_a_sawtooth_not_a_plateau():
    # a cgroup's usage filling to its 64 MiB limit in 6 s, emptied by the OOM killer, refilling
    tr = growth_trend([(t, 4 * MiB + (t % 7) * 10 * MiB) for t in range(31)])
    assert tr.shape == "sawtooth"
    assert tr.levelled_for_s is None


def test_still_moving_at_the_end_is_not_levelled_for_zero_seconds():
    # fast growth, then slower than a quarter of that pace but still moving at every sample
    tr = growth_trend([(t, 8 * MiB * min(t, 20) + 1 * MiB * max(0, t - 20)) for t in range(31)])
    assert tr.shape == "climbing"
    assert tr.levelled_for_s is None


def test_a_plateau_says_how_long_it_has_been_level():
    tr = growth_trend([(t, 8 * MiB * min(t, 20)) for t in range(31)])
    assert tr.shape == "levelled" and tr.levelled_for_s == 10


def _waves(period, take, left_behind=0.0, base=8 * MiB, seconds=31, noise=None):
    """A wave every `period` s: `take` bytes over the first half of it, given back at its end but
    for `left_behind` of each (a step that stays)."""
    n = noise or (lambda: 0.0)
    points, kept = [], 0.0
    for t in range(seconds):
        phase = t % period
        if t and phase == 0:
            kept += left_behind
        up = take * min(1.0, (phase + 1) / (period / 2)) if phase < period - 1 else 0.0
        points.append((t, base + kept + up + n()))
    return points


def test_a_sawtooth_back_to_the_same_base_is_level_with_its_troughs_and_peaks():
    tr = growth_trend(_waves(6, 40 * MiB, noise=_noise(3)))
    assert tr.shape == "sawtooth" and tr.base == "level"
    assert len(tr.troughs) >= 3 and len(tr.peaks) == len(tr.troughs)
    assert all(abs(v - 8 * MiB) < 256 * 1024 for v in tr.troughs)
    assert all(abs(v - 48 * MiB) < 256 * 1024 for v in tr.peaks)


def test_a_step_left_behind_by_each_wave_is_a_rising_base():
    """Partial frees: each wave gives back all but 4 MiB, so the troughs rise: never level."""
    tr = growth_trend(_waves(6, 40 * MiB, left_behind=4 * MiB, noise=_noise(4)))
    assert tr.shape in ("sawtooth", "climbing")
    assert tr.shape == "climbing" or tr.base == "rising", tr
    small = growth_trend(_waves(6, 40 * MiB, left_behind=512 * 1024))  # 0.5 MiB a wave: over the floor
    assert small.shape == "climbing" or small.base == "rising", small


def test_peaks_that_rise_over_a_level_base_are_no_bound():
    points = [(t, 8 * MiB + (4 + t // 6 * 8) * MiB * (t % 6 < 3)) for t in range(30)]
    tr = growth_trend(points)
    assert tr.shape == "sawtooth" and tr.base == "rising", tr


def test_one_fall_says_nothing_of_a_base():
    points = [(t, (8 + min(t, 10) * 3) * MiB if t < 12 else (8 + (t - 12)) * MiB) for t in range(20)]
    tr = growth_trend(points)
    assert tr.shape == "sawtooth" and tr.base is None and len(tr.troughs) == 1


def test_a_fall_the_series_ends_in_is_no_trough():
    """Its low may not be the trough yet (the series ended while it fell): left out."""
    points = _waves(6, 40 * MiB)[:-1] + [(30, 30 * MiB)]
    tr = growth_trend(points)
    assert all(v < 9 * MiB for v in tr.troughs), tr.troughs


def test_troughs_that_jitter_around_one_base_are_level():
    """A collector's troughs land anywhere within half a MiB of one base: no rise out of their noise,
    none a new high base, so level (a last trough 0.5 MiB over the lowest is jitter, not a step)."""
    troughs = [6.0, 6.6, 5.9, 6.5, 5.95, 6.4]
    points, t = [], 0
    for low in troughs:
        points += [(t, 7 * MiB), (t + 1, 7 * MiB), (t + 2, low * MiB)]
        t += 3
    points.append((t, 7 * MiB))
    tr = growth_trend(points)
    assert tr.shape == "sawtooth" and tr.base == "level", tr
    assert [round(v / MiB, 2) for v in tr.troughs] == troughs


def _falls_to(troughs, peak=7 * MiB):
    points, t = [], 0
    for low in troughs:
        points += [(t, peak), (t + 1, peak), (t + 2, low)]
        t += 3
    return [*points, (t, peak)]


def test_three_scattered_troughs_are_no_trend():
    """Three troughs, one low (5.77, 6.55, 6.36 MiB): their least-squares rise is 0.6 MiB, but three
    points scattered so tell no slope from zero, and none is a new high base."""
    tr = growth_trend(_falls_to([5.77 * MiB, 6.55 * MiB, 6.36 * MiB]))
    assert tr.shape == "sawtooth" and tr.base == "level", tr


def test_troughs_rising_steadily_through_their_scatter_are_rising():
    """0.3 MiB a fall, with 0.1 MiB of scatter: each step under the last one's reach, the trend
    plain (the same troughs without the rise are level)."""
    scatter = [0.1, -0.1, 0.05, -0.05, 0.1, -0.1]
    rising = growth_trend(_falls_to([(6 + 0.3 * i + e) * MiB for i, e in enumerate(scatter)], peak=12 * MiB))
    assert rising.shape == "sawtooth" and rising.base == "rising", rising
    level = growth_trend(_falls_to([(6 + e) * MiB for e in scatter], peak=12 * MiB))
    assert level.shape == "sawtooth" and level.base == "level", level


def test_a_batch_caught_at_any_height_on_its_way_up_is_still_level():
    """A short batch is read wherever a sample lands on its rise (17.6, 13.6 then 49.6 MiB of the
    same 48 MiB batch): peaks scattered so are no rise, the troughs are level."""
    series = [1.6] * 6 + [17.6] + [1.7] * 7 + [13.6] + [1.7] * 7 + [13.6, 49.6] + [1.7] * 6 + [13.6]
    tr = growth_trend([(t, v * MiB) for t, v in enumerate(series)])
    assert tr.shape == "sawtooth" and tr.base == "level", tr


def test_rising_back_to_an_earlier_peak_after_a_fall_is_no_climb():
    """A collector's heap: it falls 1 MiB and rises back to the peak it reached before, the window
    ending at that peak: the latest third rises out of its noise, but to no new high (6.8 to 6.8 MiB
    over the window): a sawtooth, level, not "still climbing"."""
    series = [6.8, 6.5, 5.7, 6.6, 6.6, 6.5, 6.6, 6.7, 6.6, 6.8, 6.5, 6.4, 6.4, 6.5, 6.7, 6.9, 5.7, 5.7]
    series += [6.2, 6.7, 6.8, 5.8, 6.5, 6.6, 6.8, 6.5, 6.8, 6.9, 6.9, 6.9, 6.8]
    tr = growth_trend([(t, v * MiB) for t, v in enumerate(series)])
    assert tr.shape == "sawtooth" and tr.base == "level", tr
