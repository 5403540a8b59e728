"""What a flight recording costs the application (probes/jvm/meter.py): its own threads' run-queue
delay, told from the JVM's threads by name, above its rate before."""

from __future__ import annotations

from pathlib import Path

import pytest
from memdiag.probes.jvm.meter import AppMark, app_mark, waited


def task(root: Path, tid: int, comm: str, wait_ns: int) -> None:
    d = root / "100" / "task" / str(tid)
    d.mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    (d / "schedstat").write_text(f"5000000 {wait_ns} 40\n")


def test_only_the_application_threads_waits_are_its_own(tmp_path):
    task(tmp_path, 100, "java", 1_000_000)  # the launcher's thread, waiting in its join
    task(tmp_path, 101, "java", 2_000_000)  # the main thread keeps the launcher's name
    task(tmp_path, 102, "pool-1-thread-1", 3_000_000)
    task(tmp_path, 103, "C2 CompilerThre", 900_000_000)  # JFR's first start compiles here
    task(tmp_path, 104, "C1 CompilerThre", 900_000_000)
    task(tmp_path, 105, "JFR Recorder Th", 900_000_000)
    task(tmp_path, 106, "G1 Conc#0", 900_000_000)
    task(tmp_path, 107, "GC Thread#0", 900_000_000)
    task(tmp_path, 108, "VM Thread", 900_000_000)
    task(tmp_path, 109, "Attach Listener", 900_000_000)
    task(tmp_path, 110, "Reference Handl", 900_000_000)
    m = app_mark(100, tmp_path)
    assert m.threads == 3 and m.wait_s == pytest.approx(0.006)


def test_the_delay_is_above_its_rate_before_and_whole_without_it():
    since = AppMark(at=0.0, wait_s=1.0, threads=2)
    a = AppMark(at=10.0, wait_s=1.2, threads=2)  # before: 20 ms a second waiting
    b = AppMark(at=20.0, wait_s=1.9, threads=2)
    assert waited(since, a, b) == pytest.approx(0.7 - 0.2)
    assert waited(None, a, b) == pytest.approx(0.7)  # no rate before: all of it (an upper bound)
    # a mark under a second before the probe gives no rate: nothing is subtracted
    assert waited(AppMark(at=9.5, wait_s=0.0, threads=2), a, b) == pytest.approx(0.7)
    # never below nothing: quieter than before is no negative cost
    assert waited(since, a, AppMark(at=20.0, wait_s=1.21, threads=2)) == 0.0


def test_a_target_of_many_threads_is_read_to_a_bound(tmp_path, monkeypatch):
    from memdiag.probes.jvm import meter

    for tid in range(100, 110):
        task(tmp_path, tid, "worker", 1_000_000)
    monkeypatch.setattr(meter, "MAX_THREADS", 4)
    assert app_mark(100, tmp_path).threads == 4 and len(meter.thread_times(100, tmp_path)) <= 4
