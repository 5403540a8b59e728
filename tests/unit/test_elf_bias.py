"""ElfInfo.bias: a mapping's runtime address minus the ELF's virtual address, on a real Rust release
binary whose code starts inside the page its read-only data ends in (rust-lld's packing: the code's
segment has file offset 0x...040 at virtual address 0x...040 + a page). The kernel maps that page
twice, once for each segment; the code's mapping must be given the code segment's bias, or every
return address in it names nothing ("[unknown] [claims]", before)."""

from __future__ import annotations

import subprocess

from kit import build
from memdiag.probes.elf import ElfInfo
from memdiag.probes.mapping import read_maps


def test_the_code_mapping_of_a_rust_release_binary_finds_its_functions_bytes():
    binary = build("claims")
    p = subprocess.Popen([str(binary), "10"], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        maps = read_maps(p.pid)
        elf = ElfInfo(str(binary))
        (code,) = [m for m in maps if m.path == str(binary) and m.executable]
        (text,) = [s for s in elf.loads if s["p_flags"] & 1]
        # what this test is about: the code segment starts inside a page (lld links so; the kit
        # links with it); a linker that page-aligns it would not reach the case: said here
        assert text["p_offset"] % 4096 and code.offset < text["p_offset"], (hex(text["p_offset"]), code)
        bias = elf.bias(code)
        assert bias is not None
        sym = next(s for s in elf.symbols() if "settle_claim" in s.name)
        at = sym.address + bias
        assert code.start <= at < code.end
        with open(f"/proc/{p.pid}/mem", "rb") as mem:
            mem.seek(at)
            running = mem.read(32)
        with open(binary, "rb") as f:
            f.seek(elf.file_offset(sym.address))
            assert running == f.read(32)  # the function's own code, where the bias says it runs
        found = elf.lookup(at + 0x10 - bias)
        assert found is not None and "settle_claim" in found[0].name
    finally:
        p.kill()
        p.wait()
