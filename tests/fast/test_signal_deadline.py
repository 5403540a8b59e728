"""SIGTERM and SIGINT end memdiag within a second whatever its main thread is doing: blocked in
open() of a FIFO (as a target's planted `release` file or perf map blocked it), or looping in a
parser. A real memdiag CLI process (cli.main, its signal handling and exit codes), the seam being
which call blocks: a function of the diagnosis replaced by one that opens a FIFO nobody writes, a
real blocking system call (the planted files themselves are refused by their readers now)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memdiag.system.signals import STOP_GRACE_S

SEAM = """
import sys, time
from memdiag.diagnose import cli
from memdiag.diagnose.commands import run
from memdiag.system import signals
from memdiag.system.signals import INTERRUPTION, phase, target_released
from memdiag.diagnose.errors import SignalInterrupted

def blocked(args):
    if sys.argv[1] == "counters-slow":  # only counters read: nothing of memdiag's held in the target
        with phase("counters (first look)", holds=False):
            print("ready", flush=True)
            INTERRUPTION.wait(60)
            time.sleep(signals.STOP_GRACE_S + 2)  # a slow machine's stop: past the stop grace
            raise SignalInterrupted(INTERRUPTION.signum, "partial report: x")
    with phase("reading a planted file"):
        print("ready", flush=True)
        if sys.argv[1] == "fifo":
            open(sys.argv[2]).read()  # no writer: open() blocks in the kernel
        elif sys.argv[1] == "spin":
            n = 1
            while n:  # a counter that never reaches its end (the hsperfdata 2**63-1 case)
                n = (n * 3 + 1) % (2**63 - 1) or 1
        elif sys.argv[1] == "stuck-stop":
            INTERRUPTION.wait(60)
            open(sys.argv[2]).read()  # the stop itself blocks (a read of a planted file for the report)
        elif sys.argv[1] == "slow-stop":
            INTERRUPTION.wait(60)
            time.sleep(float(sys.argv[2]))  # detaching and writing: slower than the notice grace
            said = "interrupted by SIGTERM during reading a planted file; partial report: x"
            raise SignalInterrupted(INTERRUPTION.signum, said)
        elif sys.argv[1].startswith("released-"):  # the target let go; then the report is slow, or blocks
            INTERRUPTION.wait(60)
            target_released()
            if sys.argv[1] == "released-slow":
                time.sleep(signals.STOP_GRACE_S + 2)
                raise SignalInterrupted(INTERRUPTION.signum, "partial report: x")
            signals.WRITE_GRACE_S = signals.STOP_GRACE_S + 1  # shortened here: 30 s in memdiag
            open(sys.argv[2]).read()

run._target = blocked
sys.exit(cli.main(["--pid", "1", "--duration", "1", "--output", sys.argv[3], "--quiet"]))
"""


def _start(tmp_path: Path, mode: str, arg: str = "") -> subprocess.Popen:
    p = subprocess.Popen(
        [sys.executable, "-c", SEAM, mode, arg, str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout.readline() == "ready\n", p.communicate(timeout=10)
    return p


def _signal_and_time(p: subprocess.Popen, sig: int) -> tuple[float, str]:
    time.sleep(0.2)  # inside the call by now
    sent = time.monotonic()
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=10)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return time.monotonic() - sent, err


def _wchan(pid: int) -> str:
    return Path(f"/proc/{pid}/wchan").read_text()


@pytest.mark.alone  # a sub-second bound on this host's clock: the machine to itself
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_main_thread_blocked_in_a_fifo_open_ends_within_a_second(tmp_path, sig):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    p = _start(tmp_path, "fifo", str(fifo))
    time.sleep(0.2)
    assert _wchan(p.pid) in ("wait_for_partner", "fifo_open")  # really blocked in the kernel's FIFO open
    took, err = _signal_and_time(p, sig)
    assert p.returncode == 128 + sig, err
    assert took < 1.0, took
    name = signal.Signals(sig).name
    assert err.strip() == (
        f"memdiag: interrupted by {name} during reading a planted file; it did not stop within 0.6 s "
        "(blocked in a read or a loop): ended without a report"
    ), err
    assert "Traceback" not in err


@pytest.mark.alone  # a sub-second bound on this host's clock: the machine to itself
def test_a_main_thread_spinning_in_a_parser_ends_within_a_second(tmp_path):
    p = _start(tmp_path, "spin")
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert took < 1.0, took
    assert err.strip().startswith("memdiag: interrupted by SIGTERM during reading a planted file; it did not stop")


def test_a_stop_under_way_is_given_its_time_and_ends_cleanly(tmp_path):
    p = _start(tmp_path, "slow-stop", "2")  # 2 s: past the notice grace, well within the stop's
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert 2 <= took < 4, took
    assert err.strip() == "memdiag: interrupted by SIGTERM during reading a planted file; partial report: x", err


def test_once_the_target_is_released_a_slow_report_is_given_its_time(tmp_path):
    p = _start(tmp_path, "released-slow")
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert STOP_GRACE_S + 2 <= took < STOP_GRACE_S + 4, took
    assert err.strip() == "memdiag: partial report: x", err


def test_a_report_that_blocks_after_the_release_ends_at_the_write_grace(tmp_path):
    fifo = tmp_path / "report"
    os.mkfifo(fifo)
    p = _start(tmp_path, "released-stuck", str(fifo))
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert STOP_GRACE_S + 1 <= took < STOP_GRACE_S + 2, took
    assert err.strip() == (
        "memdiag: interrupted by SIGTERM during reading a planted file; its report was not written within "
        f"{STOP_GRACE_S + 1:g} s of the target's release: ended without a report"
    ), err


def test_a_stop_that_blocks_ends_at_the_stop_grace(tmp_path):
    fifo = tmp_path / "release"
    os.mkfifo(fifo)
    p = _start(tmp_path, "stuck-stop", str(fifo))
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert STOP_GRACE_S <= took < STOP_GRACE_S + 1, took
    assert err.strip() == (
        "memdiag: interrupted by SIGTERM during reading a planted file; its stop did not finish within "
        f"{STOP_GRACE_S:g} s: ended without a report"
    ), err


def test_a_stop_while_only_counters_are_read_is_given_the_write_grace(tmp_path):
    """Nothing attached or stopped in the target (the lane's SIGTERM in a swapping process's first
    look, under qemu): its slow stop writes the report, not ended at the stop grace."""
    p = _start(tmp_path, "counters-slow")
    took, err = _signal_and_time(p, signal.SIGTERM)
    assert p.returncode == 143, err
    assert STOP_GRACE_S + 2 <= took < STOP_GRACE_S + 4, took
    assert err.strip() == "memdiag: partial report: x", err
