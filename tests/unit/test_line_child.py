"""probes/linechild.py: source lines read in a child process of memdiag's own, under a memory and a
time limit, so that a target's DWARF (its binary's, or a debug file it names) can cost memdiag
neither its memory nor its time: real children on real binaries, each way the child can end."""

from __future__ import annotations

import pytest
from kit import build
from memdiag.probes import linechild
from memdiag.probes.elf import elf_info
from memdiag.probes.linechild import Request, lookup

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


@pytest.fixture(autouse=True)
def fresh():
    linechild._FAILED.clear()
    yield
    linechild._FAILED.clear()


def _request(path: str, names: list[str]) -> Request:
    elf = elf_info(path)
    return Request(path, path, elf.identity, tuple(elf.symbol_named(n).address for n in names))


def test_the_child_reads_the_lines_this_process_would(notes):
    path = str(build("orderd", ["-O2"]))
    asked = _request(path, ["main"])
    (answer,) = lookup([asked])
    assert answer.lines == (elf_info(path).lines(path).source(asked.addresses[0]),)
    assert answer.lines[0][0] == "orderd.c" and answer.note is None


def test_a_child_out_of_time_gives_no_lines_and_says_why(notes):
    path = str(build("orderd", ["-O2"]))
    (late,) = lookup([_request(path, ["main"])], deadline_s=0.000_1)
    assert late.lines is None and ("ran out" in late.note or "took more than" in late.note), late


def test_a_child_that_cannot_hold_its_reading_ends_and_its_module_is_not_tried_again(notes):
    path = str(build("orderd", ["-O2"]))
    other = str(build("wrapleak", ["-O2"]))
    first, second = lookup([_request(path, ["main"]), _request(other, ["main"])], memory=8 << 20)
    # 8 MiB of address space holds no Python: the child ends at once, on the first module
    assert first.lines is None and "ended" in first.note, first
    assert elf_info(path).identity in linechild._FAILED
    (again,) = lookup([_request(path, ["main"])])  # with room now: still not asked again, said once already
    assert again.lines is None and again.note is None
    assert second.lines is None  # the new child for it had no more room than the first


def test_a_file_that_is_not_the_one_asked_about_is_not_read(tmp_path, notes):
    path = str(build("orderd", ["-O2"]))
    asked = _request(path, ["main"])
    (answer,) = lookup([Request(asked.path, asked.module, (asked.ident[0], asked.ident[1] + 1), asked.addresses)])
    assert answer.lines == (None,)  # the inode is not the one expected: no lines from it


def test_a_signal_while_lines_are_looked_up_ends_the_wait_at_the_next_tick(notes, monkeypatch):
    """The wait for the child's answers looks for a signal every tick: blocked in it for the whole
    lookup, a SIGTERM's stop under load ran past its grace and ended memdiag without its report
    (CI: 'its stop did not finish within 3 s'). Nothing is counted as failed for it."""
    import time

    path = str(build("orderd", ["-O2"]))
    asked = _request(path, ["main"])
    calls = []
    monkeypatch.setattr(linechild, "interrupted", lambda: bool(calls.append(1)) or len(calls) > 1)
    started = time.monotonic()
    (answer,) = lookup([asked])  # the child is started (no signal yet), then the signal is seen
    assert answer.lines is None and answer.note == f"no source lines ({linechild.INTERRUPTED})"
    assert time.monotonic() - started < 2.0 and len(calls) == 2 and not linechild._FAILED
    monkeypatch.setattr(linechild, "interrupted", lambda: True)
    assert [a.note for a in lookup([asked, asked])] == [f"no source lines ({linechild.INTERRUPTED})"] * 2
