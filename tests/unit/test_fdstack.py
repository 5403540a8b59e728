"""fdstack's pure parts: the kinds of descriptor named alike on both sides, its books summed by
stack, its facts, and its lines."""

import re
from pathlib import Path

from memdiag.probes import fdstack
from memdiag.probes.fdstack import FdResult, FdStack, _fd_stack, facts_of, totals
from memdiag.probes.growth import StackGrowth

ROOT = Path(__file__).resolve().parents[2]
FRAMES = ["socketpair+0xa [libc.so.6]", "handshake_fails+0x24 [fdleak]", "main+0x130 [fdleak]"]


def test_the_kinds_of_descriptor_are_the_headers_enum_in_order():
    header = re.sub(r"/\*.*?\*/", "", (ROOT / "bpf" / "memdiag.h").read_text(), flags=re.S)
    body = re.search(r"enum fd_kind \{(.*?)\};", header, re.S).group(1)
    constants = [c.strip() for c in body.split(",") if c.strip()]
    assert constants[-1] == "FD_KIND_COUNT"
    assert tuple(c.removeprefix("FD_KIND_").lower() for c in constants[:-1]) == fdstack.FD_KINDS
    assert set(fdstack.LINKS) == set(fdstack.FD_KINDS)


def _stack(kind: str, created: int, closed: int, outstanding: int) -> FdStack:
    return FdStack(frames=FRAMES, functions=["socketpair", "handshake_fails", "main"], count=outstanding, bytes=0,
                   pid=7, method="eh_frame", kind=kind, created=created, closed=closed,
                   outstanding=outstanding)  # fmt: skip


def test_a_merged_stack_sums_its_keys_books_and_what_is_still_open():
    keys = [(7, 1, 0x10, 0x20, 1), (7, 2, 0x10, 0x28, 1)]
    merged = StackGrowth(frames=FRAMES, functions=[None] * 3, count=9, bytes=0, pid=7, method="eh_frame", keys=keys)
    books = {keys[0]: (6, 2, 1), keys[1]: (4, 4, 0)}
    now = 10_000_000_000
    holding = {keys[0]: fdstack.Held(open=2, gone=1, oldest_ns=now - 2_500_000_000)}
    s = _fd_stack(1, merged, books, holding, now)
    assert (s.kind, s.created, s.closed, s.outstanding, s.closed_untraced) == ("socketpair", 10, 6, 2, 2)
    assert s.count == 2 and s.bytes == 0 and s.oldest_age_s == 2.5


def test_facts_name_the_stack_with_the_most_descriptors_open():
    r = FdResult(name="fdstack", status="ok", duration_s=5.0, created=30, closed=18, outstanding=12,
                 stacks=[_stack("socketpair", 12, 0, 12), _stack("pipe", 10, 10, 0)])  # fmt: skip
    name = lambda frames, _fw: frames[1].split("+")[0]  # noqa: E731
    f = facts_of(r, None, name)
    assert f["fdstack.top_function"] == "handshake_fails" and f["fdstack.top_type"] == "socketpair"
    assert (f["fdstack.top_outstanding"], f["fdstack.outstanding"], f["fdstack.outstanding_rate"]) == (12, 12, 2.4)
    assert [s.count for s in fdstack.FACE.stacks.of(r)] == [12]  # a stack that closed everything is no culprit
    assert [(t.kind, t.outstanding) for t in totals(r.stacks)] == [("socketpair", 12), ("pipe", 0)]
    closed = r.model_copy(update={"stacks": [_stack("pipe", 10, 10, 0)], "outstanding": 0})
    assert facts_of(closed, None, name)["fdstack.top_function"] is None
    assert facts_of(None, None, name) == {}
    assert "  12 socketpair open (12 created, 0 closed) PID 7 via eh_frame:" in fdstack.describe(r, 5)
