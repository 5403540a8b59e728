"""The bulk symbol-table reader gives what pyelftools gives, symbol by symbol, on this machine's
libc and libstdc++ (.dynsym and .symtab where kept)."""

from __future__ import annotations

from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from memdiag.probes.elf import _bind_code, _type_code, symbol_rows

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
