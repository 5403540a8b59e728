"""The flight recorder's rounds on real cgroups and processes (serve/recorder.py), its clock a
seam: a process's climb and its cgroup's limit kept, an ended process kept for the look-back and
dropped after it, a JVM's own heap counters read beside its RSS."""

from __future__ import annotations

import time

from jvmkit import JavaWorkload
from kit import wait_until
from memdiag.diagnose.serve.recorder import HORIZON_S, STAT_AGAIN_S, Recorder

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def test_a_climbing_process_and_its_cgroup_are_kept_and_an_ended_one_dropped_after_the_look_back(workload, memcg):
    cg = memcg(256 * MiB)
    w = workload("leak", "8192", "48", cgroup=cg)  # 8 MiB/s up to 48 MiB
    clock = Clock()
    rec = Recorder(faults=False, wall=clock)
    for _ in range(5):
        rec.tick()
        clock.now += 5
        time.sleep(0.5)
    back = rec.lookback(cg.path)
    assert back is not None and back["ended"] is None
    assert [p[2] for p in back["points"]] == [256 * MiB] * 5  # the limit, every round
    usage = [p[1] for p in back["points"]]
    anon = [p[3] for p in back["points"]]
    assert usage[-1] > usage[0] + 8 * MiB and anon[-1] > anon[0] + 8 * MiB
    (proc,) = [p for p in back["processes"] if p["pid"] == w.pid]
    assert proc["comm"] == "leak" and proc["jvm"] is False
    rss = [p[1] for p in proc["points"]]
    assert rss == sorted(rss) and rss[-1] > rss[0] + 8 * MiB
    assert rec.cost()["series_bytes"] > 0 and rec.cost()["rounds"] == 5
    w.stop()
    rec.tick()
    (proc,) = [p for p in rec.lookback(cg.path)["processes"] if p["pid"] == w.pid]  # type: ignore[index]
    assert proc["ended"] == clock.now  # kept: a victim is read after it is gone
    clock.now += HORIZON_S + 1
    rec.tick()
    assert w.pid not in [p["pid"] for p in rec.lookback(cg.path)["processes"]]  # type: ignore[index]


def test_an_idle_cgroups_memory_stat_is_read_again_only_now_and_then(memcg):
    """Not a byte of usage moved: the split and limit are kept from the last read of memory.stat
    (most of a round's cost) until STAT_AGAIN_S has passed; a limit changed meanwhile is seen then."""
    cg = memcg(64 * MiB)
    clock = Clock()
    rec = Recorder(faults=False, wall=clock)
    rec.tick()
    v1 = cg.fs_path / "memory.limit_in_bytes"
    (v1 if v1.exists() else cg.fs_path / "memory.max").write_text(str(32 * MiB))
    clock.now += 5
    rec.tick()
    clock.now += STAT_AGAIN_S
    rec.tick()
    limits = [p[2] for p in rec.lookback(cg.path)["points"]]  # type: ignore[index]
    assert limits == [64 * MiB, 64 * MiB, 32 * MiB], limits


def test_a_jvms_heap_counters_are_read_beside_its_rss(memcg):
    cg = memcg(None)
    with JavaWorkload("OrderService", "2000", "8", jvm=["-Xmx256m"], cgroup=cg) as j:
        rec = Recorder(faults=False)
        rec.tick()
        series = rec.processes.get(j.pid)
        assert series is not None and series.cgroup == cg.path
        assert series.jvm is True

        def used() -> dict | None:  # the JVM's counters are published every 50 ms, from its start
            rec.tick()
            last = series.points()[-1][1]
            return last if last["heap_used"] else None

        last = wait_until(used, "the JVM's heap counters to say a heap in use", timeout=20)
        # the JVM's own sum of its generations' maxima: -Xmx give or take a few bytes of alignment
        assert abs(last["heap_max"] - 256 * MiB) < MiB and 0 < last["heap_used"] <= last["heap_max"]
        assert last["heap_after_gc"] is not None and last["rss"] > last["anon"] > 0
