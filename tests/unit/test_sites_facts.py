"""The narrowed trace's facts (probes/memleak/narrowed.py) from a result: the leak stack is the one
with the most unreachable bytes, its share of calls is its own stack's (not the function's), and
the growth it accounts for is said with where the rest is."""

from memdiag.diagnose.culprit import default_classes
from memdiag.probes.face import StackReach
from memdiag.probes.memleak.narrowed import SitesResult, SiteStack, facts_of
from memdiag.probes.memleak.reach import ReachScan

MiB = 1 << 20
SCAN = ReachScan(status="ran", paused_ms=12.0, blocks=900)


def _stack(fn: str, count: int, nbytes: int, calls: int, reach: StackReach) -> SiteStack:
    frames = [f"{fn}+0x1f [orderd]", "serve+0x40 [orderd]", "main+0x9 [orderd]"]
    return SiteStack(frames=frames, functions=[fn, "serve", "main"], count=count, bytes=nbytes, pid=7,
                     method="frame pointers", calls=calls, reach=reach)  # fmt: skip


def name(frames, forwards):
    return default_classes().name(frames, forwards or None).label


def test_the_leak_stack_and_its_own_share_of_calls():
    holds = StackReach(anchored_count=600, anchored_bytes=60 * MiB, anchor="`orders` in orderd's .bss",
                       anchor_kind="static", anchor_bytes=60 * MiB)  # fmt: skip
    held = _stack("process_order", 600, 60 * MiB, 700, holds)
    leaked = _stack("process_order", 300, 3 * MiB, 2100, StackReach(leaked_count=300, leaked_bytes=3 * MiB))
    r = SitesResult(status="ok", function="process_order", calls=2800, live_count=900, live_bytes=63 * MiB,
                    stacks=[held, leaked], reach_scan=SCAN, duration_s=10.0, rss_growth=90 * MiB)  # fmt: skip
    f = facts_of(r, None, name)
    assert f["sites.leaked_count"] == 300 and f["sites.leaked_bytes"] == 3 * MiB
    assert f["sites.leak_share"] == "1 in 7 allocations"  # 2,100 calls of that stack, 300 left: not 2,800/300
    assert f["sites.leak_rate"] == 3 * MiB / 10.0
    assert f["sites.anchor"] == "`orders` in orderd's .bss" and f["sites.anchored_ratio"] == 100.0
    assert f["sites.growth_share"] == 70.0
    assert f["sites.growth_explained"] == (
        "its blocks still allocated (63.0 MiB) are 70% of what RSS grew while traced (90.0 MiB): the rest is "
        "other code's, or pages the allocator touched for them"
    )


def test_no_scan_no_leak_facts_and_a_refusal_no_facts():
    r = SitesResult(status="ok", function="f", calls=5, live_count=0, rss_growth=-4096)
    f = facts_of(r, None, name)
    assert "sites.leaked_count" not in f and f["sites.growth_share"] is None
    assert f["sites.growth_explained"].startswith("RSS did not grow while traced")
    assert facts_of(SitesResult(status="unavailable", reason="no function to trace"), None, name) == {}


def test_a_long_windows_cycles_keep_the_run_that_found_the_leak():
    from memdiag.probes.memleak.narrowed import FACE

    leaked = _stack("process_order", 300, 3 * MiB, 2100, StackReach(leaked_count=300, leaked_bytes=3 * MiB))
    found = SitesResult(status="ok", function="process_order", stacks=[leaked], reach_scan=SCAN)
    quiet = SitesResult(status="ok", function="process_order", stacks=[], reach_scan=SCAN)
    assert FACE.keep(found, quiet) is found and FACE.keep(quiet, found) is found
    assert FACE.keep(quiet, quiet.model_copy()) is not quiet  # neither found any: the newer
