"""How native frames are named (docs/symbols.md): a compiler's clone suffix folded into the function's
name and kept as a detail, read back by the culprit and by verify's signatures; a clone GCC really
makes, in a real binary, named so; a real Rust binary's names (legacy and v0 manglings) in Rust's
terms."""

from __future__ import annotations

import time

import pytest
from kit import build
from memdiag.diagnose.culprit import default_classes, frame_details, split_frame
from memdiag.diagnose.verify import signature
from memdiag.probes.elf import passing_elf_info
from memdiag.probes.frame import Frame, split_clone
from memdiag.probes.stacks import demangle


@pytest.mark.parametrize(
    ("symbol", "name", "clone"),
    [
        ("process_order.isra.0", "process_order", ".isra.0"),
        ("process_order.constprop.0", "process_order", ".constprop.0"),
        ("process_order.constprop.0.isra.0", "process_order", ".constprop.0.isra.0"),
        ("process_order.constprop.0.cold", "process_order", ".constprop.0.cold"),
        ("parse.part.0", "parse", ".part.0"),
        ("table.lto_priv.0", "table", ".lto_priv.0"),
        ("_ZN9OrderBook6recordEl.isra.0", "_ZN9OrderBook6recordEl", ".isra.0"),
        (
            "_ZN6claims12settle_claim17h0123456789abcdefE.llvm.4242",
            "_ZN6claims12settle_claim17h0123456789abcdefE",
            ".llvm.4242",
        ),  # fmt: skip
        ("process_order", "process_order", None),
        ("foo.bar", "foo.bar", None),  # not a compiler's suffix: kept
        ("foo.isra", "foo", ".isra"),
        (".isra.0", ".isra.0", None),  # nothing before it: no function to fold it into
    ],
)
def test_a_clone_suffix_is_folded_into_the_function_name(symbol, name, clone):
    assert split_clone(symbol) == (name, clone)


def test_a_long_name_of_suffix_like_words_is_split_in_linear_time():
    # a target's symbol table is its own: 40,000 `.isra` words then a word that is none (the regex
    # searched from every dot took ~1 s a name at 10,000 words, quadratic)
    name = "f" + ".isra" * 40_000 + ".x"
    t = time.perf_counter()
    assert split_clone(name) == (name, None)
    assert split_clone("f" + ".isra.0" * 40_000) == ("f", ".isra.0" * 40_000)
    assert time.perf_counter() - t < 0.5


def test_a_frame_says_its_clone_and_line_and_the_culprit_reads_them_back():
    clone = Frame(address=1, function="process_order", offset=0x12, module="/srv/orderd", clone=".constprop.0")
    assert str(clone) == "process_order+0x12 (GCC clone .constprop.0) [orderd]"
    lined = clone.model_copy(update={"source": "orderd.c:14"})
    assert str(lined) == "process_order (orderd.c:14, GCC clone .constprop.0) [orderd]"
    llvm = Frame(address=1, function="claims::settle", offset=0x2, module="/srv/claims", clone=".llvm.77")
    assert str(llvm) == "claims::settle+0x2 (LLVM clone .llvm.77) [claims]"
    for frame in (str(clone), str(lined)):
        assert split_frame(frame) == ("process_order", "orderd")
    assert frame_details(str(clone)) == (None, ".constprop.0")
    assert frame_details(str(lined)) == ("orderd.c:14", ".constprop.0")
    assert frame_details("main.handle (main.go:30, inlined) [orderd]") == ("main.go:30", None)
    assert frame_details("OrderBook::record(long) (book.cc:12) [orderd]") == ("book.cc:12", None)
    assert split_frame("OrderBook::record(long) (book.cc:12) [orderd]") == ("OrderBook::record(long)", "orderd")
    assert frame_details("OrderBook::record(long)+0x1a [orderd]") == (None, None)
    named = default_classes().name(["malloc (malloc.c:3281) [libc.so.6]", str(lined), "main+0x3 [orderd]"])
    assert (named.function, named.source, named.clone) == ("process_order", "orderd.c:14", ".constprop.0")
    assert named.kinds[:2] == ["allocator", "culprit"]


def test_verify_matches_a_stack_whatever_its_clones_and_lines():
    before = ["malloc+0x0 [libc.so.6]", "process_order.constprop.0+0x18 [orderd]", "main+0x5 [orderd]"]
    after = ["malloc (malloc.c:3281) [libc.so.6]", "process_order (orderd.c:14, GCC clone .isra.0) [orderd]"]
    kinds = ["allocator", "culprit", "caller"]
    assert signature(after + ["main (orderd.c:38) [orderd]"], kinds) == ("process_order", "main")
    # a report of the earlier naming (the suffix in the symbol's name) reads the same
    assert signature(before, kinds) == ("process_order", "main")


def test_gcc_clones_a_static_function_and_memdiag_names_it_by_its_source_name():
    """The kit's orderd at -O2: GCC drops process_order's unused argument into a clone (and moves its
    abort path to a .cold part); the module's symbol lookup finds the clone, the frame names it."""
    elf = passing_elf_info(str(build("orderd", ["-O2"])))
    try:
        clones = [s for s in elf.symbols() if s.name.startswith("process_order")]
        assert clones and all(s.name != "process_order" for s in clones), [s.name for s in clones]
        for s in clones:
            name, suffix = split_clone(elf.lookup(s.address)[0].name)
            assert name == "process_order" and suffix and suffix.startswith((".constprop", ".isra", ".part", ".cold"))
    finally:
        elf.close()


@pytest.mark.parametrize(
    ("flags", "mangled"), [([], "_ZN6claims12settle_claim17h"), (["-C", "symbol-mangling-version=v0"], "_R")]
)
def test_a_rust_binary_s_names_read_in_rust_terms(flags, mangled):
    """The kit's claims built by rustc, legacy and v0 mangling: its symbols as rustc wrote them,
    demangled to the Rust path (no hash), a generic's type arguments kept in v0's."""
    elf = passing_elf_info(str(build("claims", flags)))
    try:
        settle = next(s for s in elf.symbols() if "settle_claim" in s.name)
        assert settle.name.startswith(mangled), settle.name
        assert demangle(settle.name) == "claims::settle_claim"
        names = {demangle(s.name) for s in elf.symbols()}
        assert "claims::main" in names
        assert not any(n.startswith(("_ZN", "_R")) for n in names if "claims" in n), sorted(names)[:20]
        if mangled == "_R":
            assert "std::rt::lang_start::<()>::{closure#0}" in names, sorted(n for n in names if "lang_start" in n)
    finally:
        elf.close()


def test_a_rust_name_that_demangles_to_a_million_characters_is_cut():
    """179 bytes of nested v0 back-references (a hostile binary's symbol) demangle to 1,000,020
    characters; every reader of the frame would pay for them (split_frame's patterns, the reports)."""
    bomb = (
        "_RINvC1a1fThhETB7_B7_ETBb_Bb_ETBj_Bj_ETBr_Br_ETBz_Bz_ETBH_BH_ETBP_BP_ETBX_BX_ETB15_B15_ET"
        "B1d_B1d_ETB1n_B1n_ETB1x_B1x_ETB1H_B1H_ETB1R_B1R_ETB21_B21_ETB2b_B2b_ETB2l_B2l_ETB2v_B2v_EE"
    )
    name = demangle(bomb)
    assert len(name) <= 4097 and name.endswith("…"), len(name)
    fn, mod = split_frame(f"{name}+0x10 [claims]")
    assert mod == "claims" and fn is not None
