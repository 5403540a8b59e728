"""vmscan's figures are thread time: a total over a trace's length is said to be one, never a
machine's time (the lane's swapping hog: 6.2 s of reclaim in a 5 s trace on one CPU)."""

from memdiag.probes.vmscan import ReclaimLatency, VmscanResult, describe


def test_reclaim_totals_are_said_to_be_thread_time_and_slab_inside_the_rest():
    r = VmscanResult(
        name="vmscan",
        status="ok",
        kswapd_wakeups=2,
        reclaim=[
            ReclaimLatency(kind="direct", events=40, total_ms=6200.0, pages_reclaimed=900, histogram_us={"8-15": 40}),
            ReclaimLatency(kind="slab", events=80, total_ms=300.0, pages_reclaimed=10, histogram_us={}),
        ],
    )
    lines = describe(r, 5)
    assert lines[0] == "  kswapd wake-ups: 2"
    assert "summed over every thread that reclaimed" in lines[1] and "part of theirs" in lines[1]
    assert "6200.0 ms of thread time" in lines[2] and "900 pages" in lines[2]
    assert "300.0 ms of thread time" in lines[4]
