"""`memdiag top --once`: the live per-process view, one table."""

import pytest


@pytest.mark.alone  # the grower first of every process on the host: no emulated machine filling beside it
def test_top_sorts_the_grower_first(memdiag, workload):
    w = workload("leak", "8192")
    workload("churn", "1000")
    # -n smaller than the processes surely present (the test runner, memdiag, leak, churn): a clean CI
    # machine may run fewer than ten processes in all.
    r = memdiag("top", "--once", "-n", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("MemAvailable ") and "PSI some/full avg10" in lines[0]
    assert lines[1].split()[:3] == ["PID", "COMM", "RSS"]
    first = lines[2].split()
    assert int(first[0]) == w.pid and first[1] == "leak"
    assert float(first[8]) > 4096  # GROW KiB/s: it leaks 8 MiB/s
    assert len(lines) == 2 + 3


def test_top_bad_interval(memdiag):
    r = memdiag("top", "--once", "--interval", "-1")
    assert r.returncode == 2 and "argument --interval: '-1' is not a finite number at least 0.01" in r.stderr
