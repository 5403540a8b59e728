"""Probe tests need root and a working bcc; say why they skip where those are missing."""

import os

import pytest
from memdiag.probes import kernel


@pytest.fixture(autouse=True, scope="session")
def _bpf_ready():
    if os.geteuid() != 0:
        pytest.skip("BPF probes need root")
    ready = kernel.prepare_bcc_environment()
    if not ready.available:
        pytest.skip(f"BPF toolchain not ready: {ready.reason}")
