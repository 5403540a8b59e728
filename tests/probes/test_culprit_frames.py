"""The frames memleak reports through allocation wrappers, on the real kernel: without frame
pointers (-O2 -fomit-frame-pointer) each call path through a wrapper keeps its own stack, unwound
with .eh_frame, and the wrapper's code is read as forwarding (or not) from its instructions."""

from kit import build
from memdiag.diagnose.culprit import default_classes
from memdiag.probes import forwarders, memleak
from memdiag.probes.base import ProbeTarget
from memdiag.probes.elf import elf_info

O2 = ["-O2", "-fomit-frame-pointer"]


def test_forwarding_is_read_from_the_code_of_real_binaries():
    for flags in ([], O2):
        elf = elf_info(str(build("wrapleak", flags)))
        verdicts = {n: forwarders.forwards(elf, elf.symbol_named(n)) for n in ("xmalloc", "ticket_alloc")}
        assert verdicts == {"xmalloc": True, "ticket_alloc": True}, flags
        # they write through the block, hand it on or return something else: code to read
        for name in ("process_order", "take_ticket", "handle_request", "main"):
            assert not forwarders.forwards(elf, elf.symbol_named(name)), (flags, name)
    cxx = elf_info(str(build("cxxpaths", O2)))
    assert not any(forwarders.forwards(cxx, s) for s in cxx.symbols() if s.name in ("_Z4takel", "_Z6appendl", "main"))


def test_paths_through_two_wrappers_without_frame_pointers_name_the_callers(workload):
    w = workload("wrapleak", "2000", "7", flags=O2)
    r = memleak.run(ProbeTarget.for_pid(w.pid), 4, series_interval=1.0)
    assert r.status == "ok", r.reason
    named = {}
    for s in r.stacks:
        n = default_classes().name(s.frames, s.forwards)
        named.setdefault(n.function, (s, n))
    order, n = named["process_order"]
    assert order.functions[:3] == ["malloc", "xmalloc", "process_order"] and order.method == "eh_frame"
    assert n.kinds[:3] == ["allocator", "wrapper", "culprit"] and not n.guessed
    ticket, n = named["take_ticket"]
    assert ticket.functions[:3] == ["malloc", "ticket_alloc", "take_ticket"]
    assert ticket.forwards[1] and n.kinds[:3] == ["allocator", "guessed-wrapper", "culprit"] and n.guessed
    assert "xmalloc" not in named and "ticket_alloc" not in named
