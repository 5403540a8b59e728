"""A step of the host's clock during a window (NTP, a VM's clock resynchronised) does not stretch
the window: its stamps follow the monotonic clock from the window's anchor (stop 35's CI: a 30 s
diagnosis that took under 32 s reported a 61 s window)."""

import os
import time

from memdiag.diagnose.observe import Sampler
from memdiag.diagnose.target import pid_target
from memdiag.system import clock

STEP_S = 30.0


def test_a_clock_step_during_a_window_does_not_stretch_it(monkeypatch):
    clock.anchor()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + STEP_S)  # the host's clock steps forward
    assert time.time() - real() > STEP_S - 1  # the step is there for everything that reads time.time()
    began = time.monotonic()
    s = Sampler(pid_target(os.getpid()), duration=1.0, interval=0.25).start()
    s.join()
    obs = s.so_far()
    took = time.monotonic() - began
    assert obs.ended - obs.started <= took + 0.01
    assert obs.snapshots[-1].wall - obs.snapshots[0].wall <= took + 0.01
    assert obs.started < real()  # stamped on the anchor's clock, before the step


def test_a_new_window_takes_up_the_hosts_clock_again(monkeypatch):
    clock.anchor()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + STEP_S)
    assert abs(clock.wall() - real()) < 1  # within a window: the step is not seen
    clock.anchor()
    assert abs(clock.wall() - (real() + STEP_S)) < 1  # the next window reads the host's clock as it now is
