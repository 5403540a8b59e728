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


def test_a_scan_whose_walk_of_older_chunks_did_not_fit_runs_without_it_and_says_so():
    """The walk of glibc's chunks from before the trace is left out where it alone passes the pause
    allowed (CI: a 5 MiB heap of 12 blocks priced ~31 ms against 23 ms left, the leak unnamed), not
    where the scan would not fit without it either, nor where it fits whole."""
    from memdiag.probes.memleak.reach import fitted
    from memdiag.probes.memleak.reach.pause import Price

    est = Price(5 * MiB, 0, 1.25 * 2**30, fixed_ms=27.0, blocks=12, tls_bytes=0, links=True, links_ms=24.0)
    assert round(est.ms, 1) == 30.9
    cut = fitted(est, 23.0)
    assert (cut.links, cut.links_unpaid_ms, round(cut.ms, 1)) == (False, 24.0, 6.9)
    assert fitted(est, 40.0) is est and fitted(est, None) is est  # fits whole
    assert fitted(est, 5.0) is est  # over without it too: refused as before, the walk in its price
    assert fitted(Price(5 * MiB, 0, 1.25 * 2**30, 27.0, 12, 0), 23.0).links_unpaid_ms is None  # no walk asked
    scan = ReachScan(
        status="ran", paused_ms=8.1, priced_ms=7.0, allowed_ms=23.0, scanned_bytes=5 * MiB, regions=3, threads=1,
        blocks=12, untraced_unpaid_ms=24.0,
    )  # fmt: skip
    assert (
        "; glibc's chunks handed out before memleak attached were not walked (priced 24 ms, past the pause "
        "allowed): their words counted as roots, so a holder older than the trace is not named through them; "
    ) in scan.describe()
