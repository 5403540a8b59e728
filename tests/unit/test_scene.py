"""The scene of an OOM kill told from the flight recorder's series (serve/scene.py), and the
recorder's bounded rings (serve/recorder.py): a steady climb with its parts summing to the growth,
a climb measured from a restart, a step, a burst the samples did not see, no growth at all."""

from __future__ import annotations

from memdiag.diagnose.serve.recorder import COARSE_POINTS, FINE_POINTS, Ring, Series
from memdiag.diagnose.serve.scene import explain

MiB = 1 << 20
LIMIT = 64 * MiB
T0 = 1_800_000_000.0


def _cg(usages: list[float], shmem: float = 0.0, every: float = 5.0) -> list:
    """Points of a cgroup whose usage (MiB) is anonymous memory, beside 1 MiB of kernel memory."""
    return [
        (T0 + i * every, {"usage": int(u * MiB), "limit": LIMIT, "anon": int((u - 1 - shmem) * MiB), "file": 0,
                          "shmem": int(shmem * MiB), "kernel": MiB})
        for i, u in enumerate(usages)
    ]  # fmt: skip


def test_a_steady_climb_to_the_limit_is_told_by_its_parts_which_sum_to_its_growth():
    cg = _cg([10 + 5 * i for i in range(11)])  # 10 -> 60 MiB over 50 s
    victim = [(t, {"rss": v["anon"]}) for t, v in cg]
    s = explain(cg, victim, T0 + 52, 5.0, LIMIT, {"function": "leak_order_history", "share": 97.0, "at": T0 + 30},
                victim_name="PID 7 (leak)")  # fmt: skip
    assert s is not None and s.shape == "steady"
    assert s.growth == 50 * MiB and s.rate_per_s == MiB and s.climb_from == T0 and s.climb_s == 50
    assert s.top_part == "anon" and sum(p.growth or 0 for p in s.parts) == s.growth
    assert next(p for p in s.parts if p.key == "anon").share == 100.0
    assert s.victim_share == 100.0 and s.fault_function == "leak_order_history"
    assert "climb steadily from 10.0 MiB to 60.0 MiB of its 64.0 MiB limit over 50 s" in s.text
    assert "60.0 MiB/min; 11 samples, 5 s apart on average: anonymous +50.0 MiB (100%)" in s.text
    assert s.unseen is None  # at its pace the climb reached the limit by the kill
    assert "PID 7 (leak)'s RSS 9.0 MiB -> 59.0 MiB, 100% of the cgroup's growth" in s.text
    assert "named leak_order_history (97% of the faults sampled)" in s.text
    # the samples kept for the incident's chart, on a clock of seconds before the kill
    assert s.usage_series[0] == (-52.0, 10 * MiB, LIMIT) and s.usage_series[-1] == (-2.0, 60 * MiB, LIMIT)
    assert len(s.usage_series) == 11 and s.victim_series[-1] == (-2.0, 59 * MiB)


def test_a_service_restarted_after_an_earlier_kill_climbs_from_its_restart():
    cg = _cg([20, 40, 60, 63, 5, 15, 25, 35, 45, 55, 62])
    s = explain(cg, [], T0 + 51, 5.0, LIMIT)
    assert s is not None and s.climb_from == T0 + 20 and s.usage_first == 5 * MiB and s.growth == 57 * MiB


def test_a_climb_made_in_one_interval_is_a_step_and_one_not_seen_is_said_unseen():
    step = explain(_cg([10, 10, 10, 10, 62]), [], T0 + 21, 5.0, LIMIT)
    assert step is not None and step.shape == "step" and "climb in a step" in step.text
    burst = explain(_cg([10, 10, 10, 10, 10]), [], T0 + 21, 5.0, LIMIT)
    assert burst is not None and burst.shape == "none" and burst.unseen == 54 * MiB
    assert (
        burst.text.startswith("no growth before the kill") and "the 54.0 MiB that filled it came between" in burst.text
    )
    flat = explain(_cg([63.8] * 5), [], T0 + 21, 5.0, LIMIT)
    assert flat is not None and flat.shape == "none" and flat.unseen is None
    assert "never rose above its low; 63.8 MiB of its 64.0 MiB limit at the last sample" in flat.text
    # a climb recorded to 85% of the limit, then the rest between samples: the climb is told, and the rest
    half = explain(_cg([10 + 5 * i for i in range(10)]), [], T0 + 46, 5.0, LIMIT)
    assert half is not None and half.shape == "steady" and half.unseen == 9 * MiB
    assert "climb steadily from 10.0 MiB to 55.0 MiB" in half.text and "the last 9.0 MiB to the limit came" in half.text


def test_a_host_oom_is_not_told_as_the_cgroups_limit():
    assert all(
        lim is None for _t, _u, lim in explain(_cg([10, 20, 30]), [], T0 + 11, 5.0, None, host_oom=True).usage_series
    )
    s = explain(_cg([10 + 5 * i for i in range(11)]), [], T0 + 52, 5.0, LIMIT, host_oom=True)
    assert s is not None and s.limit is None and s.host_oom
    assert s.text.startswith("the host ran out of memory (no cgroup limit hit); in the victim's cgroup, before")
    assert "limit" not in s.text.split("(no cgroup limit hit)", 1)[1]


def test_a_fault_sample_from_before_the_climb_is_not_cited():
    cg = _cg([20, 40, 60, 63, 5, 15, 25, 35, 45, 55, 62])  # restarted at T0 + 20
    old = explain(cg, [], T0 + 51, 5.0, LIMIT, {"function": "old_code", "share": 90.0, "at": T0 + 5})
    assert old is not None and old.fault_function is None and "page-fault sample" not in old.text


def test_tmpfs_that_filled_the_cgroup_is_shared_memory_with_its_files_named():
    cg = [(t, {**v, "anon": MiB, "shmem": v["usage"] - 2 * MiB}) for t, v in _cg([10 + 5 * i for i in range(11)])]
    s = explain(cg, [], T0 + 52, 5.0, LIMIT, shm_files=[("/dev/shm/spool/job-*.spool", 800, 50 * MiB)])
    assert s is not None and s.top_part == "shmem" and sum(p.growth or 0 for p in s.parts) == s.growth
    assert "shared memory (tmpfs, shm) +50.0 MiB (100%)" in s.text
    assert "its largest process sees, the files /dev/shm/spool/job-*.spool number 800 (50.0 MiB)" in s.text


def test_a_jvms_own_heap_counters_are_said_beside_its_rss():
    cg = _cg([10 + 5 * i for i in range(11)])
    heap = [(t, {"rss": v["anon"], "heap_after_gc": (2 + 4 * i) * MiB, "heap_max": 1 << 30})
            for i, (t, v) in enumerate(cg)]  # fmt: skip
    s = explain(cg, heap, T0 + 52, 5.0, LIMIT)
    assert s is not None and (s.jvm_heap_first, s.jvm_heap_last) == (2 * MiB, 42 * MiB)
    assert "the Java heap after GC (its own counters) 2.0 MiB -> 42.0 MiB of its 1.0 GiB maximum (-Xmx)" in s.text


def test_no_sample_before_the_kill_is_no_scene():
    assert explain(_cg([10, 20]), [], T0 - 1, 5.0, LIMIT) is None


def test_the_rings_keep_the_latest_and_the_coarse_ring_the_hour_before():
    r = Ring(4, 2)
    for i in range(7):
        r.push(float(i), (i, -i))
    assert r.items() == [(3.0, (3, -3)), (4.0, (4, -4)), (5.0, (5, -5)), (6.0, (6, -6))]
    s = Series(("usage", "anon"))
    for i in range(2 * 3600 // 5):  # two hours at 5 s
        s.push(T0 + 5 * i, {"usage": i, "anon": None})
    pts = s.points()
    times = [t for t, _v in pts]
    assert times == sorted(times) and len(pts) <= FINE_POINTS + COARSE_POINTS
    assert pts[-1] == (T0 + 5 * (2 * 3600 // 5 - 1), {"usage": 2 * 3600 // 5 - 1, "anon": None})
    assert times[-1] - times[0] >= 3600  # the look-back's hour, coarser further back
    assert s.nbytes == (FINE_POINTS + COARSE_POINTS) * 8 * 3  # fixed: one time and two values a point


def test_a_series_rise_is_its_latest_less_the_one_n_samples_before():
    s = Series(("rss",))
    assert s.rise("rss", 3) is None  # nothing yet
    for i, v in enumerate([10, 11, None, 15, 20]):
        s.push(T0 + 5 * i, {"rss": v})
    assert s.rise("rss", 3) == 20 - 11 and s.rise("rss", 2) is None  # the one 2 before is unknown
    assert s.rise("rss", 9) == 20 - 10  # fewer kept than asked: from the oldest
    assert s.recent("rss", 3) == [(T0 + 15, 15.0), (T0 + 20, 20.0)]  # unknown values left out
