"""The reachability scan and a process with more mappings than memdiag keeps (issue 42, item 3): found
through the real CLI on a target with 660,000 mappings (vm.max_map_count raised), the scan read every
line of /proc/PID/maps whole while the target was stopped (33 MiB of text, 660,000 objects: memdiag's
peak 308 MiB, and the stop ran to 1.98 s for a 462 ms allowance). Now the price refuses such a process
before any stop, and the read under the stop, a line at a time, gives up past the same bound. Here on
this test's own process, with the bounds lowered so that its few hundred mappings pass them."""

import os

import numpy as np
import pytest
from memdiag.probes import mapping
from memdiag.probes.memleak import reach
from memdiag.probes.memleak.reach import pause
from memdiag.probes.memleak.reach.model import Blocks, ScanAborted


def _blocks() -> Blocks:
    return Blocks(np.array([0x1000], dtype=np.uint64), np.array([64], dtype=np.uint64), np.zeros(1, dtype=np.int64))


def test_a_process_past_the_mapping_bound_is_refused_before_any_stop(monkeypatch):
    monkeypatch.setattr(mapping, "MAX_CODE_MAPPINGS", 8)
    monkeypatch.setattr(mapping, "MAX_DATA_MAPPINGS", 8)
    monkeypatch.setattr(pause, "MAX_SCAN_MAPPINGS", 16)
    est = pause.price(os.getpid(), _blocks(), 0.0, 1000.0)
    assert est is not None and est.refused is not None, est
    assert est.refused.endswith("past the 16 a scan reads within memdiag's memory bound: not stopped, not scanned")


def test_a_process_within_the_bound_is_priced_as_before():
    est = pause.price(os.getpid(), _blocks(), 0.0, 1000.0)
    assert est is not None and est.refused is None, est.refused


def test_the_read_under_the_stop_gives_up_past_the_bound(monkeypatch):
    assert len(reach._every_mapping(os.getpid())) > 16  # every line, within the bound
    monkeypatch.setattr(reach, "MAX_SCAN_MAPPINGS", 16)
    with pytest.raises(ScanAborted, match="more than 16 mappings"):
        reach._every_mapping(os.getpid())
