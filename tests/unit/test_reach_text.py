"""The reachability scan said in words: every case on its whole output, and the merge of two stack
keys that symbolize alike."""

from memdiag.probes.memleak.reach import ReachScan, StackReach, merged

MiB = 1 << 20


def test_a_scan_that_ran_says_what_it_paused_read_and_checked():
    scan = ReachScan(
        status="ran", paused_ms=31.2, at_s=12.0, priced_ms=48, allowed_ms=420, scanned_bytes=40 * MiB,
        swapped_bytes=2 * MiB, regions=8, threads=2, blocks=4896, references=12, speed_bytes_per_s=2.5 * 2**30,
    )  # fmt: skip
    assert scan.describe() == (
        "ran 12.0 s into memleak: paused the target 31.2 ms (priced 48 ms, allowed 420 ms) to read 40.0 MiB of "
        "writable memory in 8 mappings (scan 2.5 GiB/s), 2.0 MiB of it paged in from swap; 2 thread(s), 4,896 "
        "outstanding blocks checked, 12 references between them; every thread stopped with ptrace (seize + "
        "interrupt) while memleak's table was read and memory scanned, then resumed"
    )


def test_a_scan_that_did_not_run_or_stopped_short_says_why():
    assert ReachScan(status="skipped", reason="over").describe() == "skipped: over"
    assert ReachScan(status="failed", reason="stopped", paused_ms=61.0).describe() == (
        "failed: stopped; paused the target 61.0 ms"
    )
    assert ReachScan(status="ran", reason="no outstanding block to check").describe() == (
        "ran: no outstanding block to check"
    )


def test_two_keys_of_one_stack_add_up_and_keep_the_heavier_anchor():
    a = StackReach(leaked_count=2, leaked_bytes=200, anchored_count=1, anchored_bytes=100, anchor="x", anchor_bytes=100)
    b = StackReach(leaked_count=1, leaked_bytes=50, unreferenced_count=1, anchored_count=3, anchored_bytes=300,
                   anchor="y", anchor_kind="static", anchor_bytes=300)  # fmt: skip
    m = merged(a, b)
    assert (m.leaked_count, m.leaked_bytes, m.unreferenced_count) == (3, 250, 1)
    assert (m.anchored_count, m.anchored_bytes, m.anchor, m.anchor_kind, m.anchor_bytes) == (4, 400, "y", "static", 300)
    same = merged(b, b)
    assert same.anchor == "y" and same.anchor_bytes == 600
    assert merged(None, a) is a and merged(a, None) is a
