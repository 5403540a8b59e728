"""Fixtures the unit tests of one module family share."""

from __future__ import annotations

import pytest
from memdiag.probes import elf as elfmod
from memdiag.probes.elf import forget


@pytest.fixture
def notes():
    """The symbolizer's notes (what it skipped and why), empty, with no ELF file remembered, before
    and after the test."""
    forget()
    elfmod.NOTES.clear()
    yield elfmod.NOTES
    forget()
    elfmod.NOTES.clear()
