"""The second-kernel lane's tests run inside its guest only (scripts/vm.sh: Debian 12's stock kernel,
systemd, cgroup v2 alone, under qemu's software emulation); tests/conftest.py leaves this folder out
everywhere else. The helpers the tests share are in lane.py."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _in_the_lane():
    if os.environ.get("MEMDIAG_LANE_GUEST") != "1":
        pytest.fail("tests/vm run inside the second-kernel lane's guest only (scripts/vm.sh)")
