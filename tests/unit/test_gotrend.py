"""Shapes of series the Go runtime estimates from samples: a bounded cache's noisy estimate (read
at twelve GCs from a real 94 MiB cache) is flat, a held set that keeps growing climbs, a filled
then held one levelled; exact counts take the same test without the sampling's noise."""

from __future__ import annotations

from memdiag.probes.go.trend import sampled_shape

MiB = 1 << 20
RATE = 512 << 10


def _mib(*values: float) -> list[float]:
    return [v * MiB for v in values]


def test_a_bounded_cache_read_at_twelve_gcs_is_flat():
    cache = _mib(99.5, 94.0, 93.4, 95.5, 105.6, 80.2, 94.5, 108.7, 89.9, 87.9, 86.3, 91.4)
    assert sampled_shape(list(range(12)), cache, replaced=900 * MiB, rate=RATE, least=2 * RATE) == "flat"
    # five of its points that happened to rise (85.3 -> 101 MiB): within the sampling's noise
    rising = _mib(85.3, 95.0, 90.0, 99.0, 101.0)
    assert sampled_shape([0, 3, 6, 9, 12], rising, replaced=900 * MiB, rate=RATE, least=2 * RATE) == "flat"


def test_a_held_set_climbs_a_filled_one_levels_a_freed_one_shrinks():
    held = _mib(45, 47, 51, 55, 60, 65, 71, 74)  # the error-path map, read at 8 GCs
    assert sampled_shape([0, 2, 4, 6, 8, 10, 12, 14], held, rate=RATE, least=2 * RATE) == "climbing"
    filled = _mib(10, 30, 50, 70, 90, 94, 92, 95, 93, 96, 94, 93)
    assert sampled_shape(list(range(12)), filled, replaced=500 * MiB, rate=RATE, least=2 * RATE) == "levelled"
    freed = _mib(90, 80, 70, 60, 50)
    assert sampled_shape(list(range(5)), freed, replaced=100 * MiB, rate=RATE, least=2 * RATE) == "shrinking"
    assert sampled_shape([0, 1, 2], held[:3], rate=RATE) == "unknown"  # three points say nothing


def test_goroutine_counts():
    assert sampled_shape([0, 1, 2, 3, 4], [439, 553, 673, 798, 900], least=2) == "climbing"
    assert sampled_shape([0, 1, 2, 3, 4], [3, 3, 3, 4, 3], least=2) == "flat"


def test_the_standard_library_is_told_by_its_package_path():
    from memdiag.probes.go.memory import standard_library

    std = ["internal/poll.runtime_pollWait", "net/http.(*conn).serve", "sync.runtime_Semacquire", "os/signal.loop"]
    own = ["main.serve", "main.(*cache).fetch", "github.com/x/y.(*T).m", "golang.org/x/sync/errgroup.(*Group).Go.func1"]
    assert all(standard_library(f) for f in std) and not any(standard_library(f) for f in own)


def test_the_marked_heap_is_one_point_per_gc_however_often_it_was_read():
    from types import SimpleNamespace

    from memdiag.probes.go.view import _per_gc

    # a real bounded cache, read every second at three reads per GC: per read a "climb" of 1.3 MiB
    # (each GC's count weighed three times), per GC a flat series
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.1, 6.1, 7.1, 8.1, 9.1, 10.1, 11.1, 12.0]
    cycles = [7, 7, 8, 8, 9, 9, 9, 10, 10, 10, 11, 11, 11]
    marked = [98982296, 98982296, 99166072, 99166072, 98939640, 98939640, 98939640]
    marked += [99242072, 99242072, 99242072, 100257912, 100257912, 100257912]
    r = SimpleNamespace(pacer_times=times, pacer_cycles=cycles, heap_marked=marked)
    assert sampled_shape(times, marked, least=256 << 10) == "climbing"  # what it was called before
    per_gc = _per_gc(r)
    assert per_gc == ([0.0, 2.0, 4.0, 7.1, 10.1], [98982296, 99166072, 98939640, 99242072, 100257912])
    assert sampled_shape(*per_gc, least=256 << 10) == "flat"
