"""The bulk symbol-table reader gives what pyelftools gives, symbol by symbol, on this machine's
libc and libstdc++ (.dynsym and .symtab where kept)."""

from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from memdiag.probes.symtab import _bind_code, _type_code, symbol_rows

LIBS = [
    p for p in ("/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6") if Path(p).exists()
]


@pytest.mark.parametrize("path", LIBS)
def test_bulk_rows_are_pyelftools_rows(path):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        tables = [s for s in elf.iter_sections() if isinstance(s, SymbolTableSection)]
        assert tables
        for sec in tables:
            want = [
                (
                    s.name,
                    s["st_value"],
                    s["st_size"],
                    _type_code(s["st_info"]["type"]),
                    _bind_code(s["st_info"]["bind"]),
                    s["st_shndx"] == "SHN_UNDEF",
                )
                for s in sec.iter_symbols()
            ]
            got = [
                (n, v, z, t if t in (1, 2, 10) else -1, b if b in (1, 2) else 0, x == 0)
                for n, v, z, t, b, x in symbol_rows(elf, sec)
            ]
            assert got == want, sec.name


@pytest.mark.parametrize("path", [*LIBS, "/usr/bin/python3.11"])
def test_the_section_map_from_headers_is_pyelftools_own_and_builds_no_hash_table(path, monkeypatch):
    """open_elf's name map is the one pyelftools makes by building every section, made from the
    headers alone: no hash section (whose table pyelftools parses whole) is built for it."""
    from elftools.elf import elffile
    from memdiag.probes.elf import ElfInfo
    from memdiag.system.elfread import open_elf

    with open(path, "rb") as f:
        own = ELFFile(f)
        own._make_section_name_map()
        built = []
        real = elffile.ELFFile._make_elf_hash_section
        monkeypatch.setattr(elffile.ELFFile, "_make_elf_hash_section", lambda s, *a: built.append(a) or real(s, *a))
        elf = open_elf(f)
        assert elf._section_name_map == own._section_name_map
        assert elf.get_section_by_name(".dynsym") is not None
        info = ElfInfo(path)
        bss = info.elf.get_section_by_name(".bss")
        assert info.section_of(bss["sh_addr"]) == ".bss"
        assert not built
