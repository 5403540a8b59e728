"""Where a function calls the allocator (probes/memleak/callsites.py), read from real builds of the
kit's programs with the system compiler (through the PLT, the GOT with -fno-plt, CET's .plt.sec,
C++'s operator new) and from Debian's own CPython. No root: nothing is attached."""

from __future__ import annotations

import pytest
from kit import build
from memdiag.probes.elf import ElfInfo
from memdiag.probes.memleak.callsites import call_sites, wrapper_sites
from memdiag.system import arch

PYTHON = "/usr/bin/python3.11"


def _sites(binary, function: str):
    elf = ElfInfo(str(binary))
    sym = elf.symbol_named(function)
    assert sym is not None, function
    return elf, call_sites(elf, sym)


@pytest.mark.parametrize("flags", [[], ["-fno-plt"], ["-fcf-protection=full"]], ids=["plt", "no-plt", "cet"])
def test_the_leaking_functions_call_to_malloc_and_where_it_returns(flags):
    elf, sites = _sites(build("hot", flags), "leak_session_cache")
    assert [s.callee for s in sites] == ["malloc"]
    s = sites[0]
    md = arch.disassembler()
    call = next(md.disasm(elf.read_at(s.call_address, 16), s.call_address))
    assert call.mnemonic == "call" and s.return_address == s.call_address + call.size
    assert s.caller == "leak_session_cache"


def test_a_function_that_allocates_nothing_has_no_site():
    _elf, sites = _sites(build("leak"), "main")  # it calls leak_order_history and handle_request, not malloc
    assert sites == []


@pytest.mark.parametrize("flags", [["-O1"], ["-O2"]], ids=["O1", "O2"])
def test_a_wrapper_one_level_down_is_followed_and_a_function_that_fills_its_block_is_not(flags):
    """process_order gets its order from xmalloc, take_ticket from ticket_alloc (both only forward
    what malloc returned): their calls to the wrapper are the sites. main calls handle_request,
    which mallocs and fills its block: no wrapper, so main has no site."""
    binary = build("wrapleak", flags)
    elf = ElfInfo(str(binary))
    for function, wrapper in (("process_order", "xmalloc"), ("take_ticket", "ticket_alloc")):
        sym = elf.symbol_named(function)
        assert call_sites(elf, sym) == []
        found = wrapper_sites(elf, sym)
        assert [(s.caller, s.callee) for s in found] == [(function, wrapper)], found
    assert wrapper_sites(elf, elf.symbol_named("main")) == []
    leak = ElfInfo(str(build("leak", flags)))
    assert wrapper_sites(leak, leak.symbol_named("main")) == []  # leak_order_history fills its block


def test_operator_new_in_cxx_code():
    elf = ElfInfo(str(build("cppleak")))
    callees = {s.name: [c.callee for c in call_sites(elf, s)] for s in elf.symbols()}
    assert callees["_ZN9OrderBook6recordEl"] == ["_Znwm"]
    assert callees["_ZN9OrderBook5quoteEl"] == ["_Znam"]


def test_a_distribution_binary():
    """Debian's CPython: PyUnicode_New's own call to malloc (pymalloc's large-object path, inlined)."""
    _elf, sites = _sites(PYTHON, "PyUnicode_New")
    assert "malloc" in [s.callee for s in sites]
