"""One ELF module's symbols, held compact (SymbolTable: rows in arrays, names in one blob, the
Symbol made when one is looked up), and a symbol table's rows read from the file in bulk
(symbol_rows). Bounded whatever a module claims: rows, names and every module's tables together.
probes/elf.py fills the tables from a module's .dynsym and .symtab and looks addresses up in them."""

from __future__ import annotations

import bisect
import itertools
import struct
import weakref
from array import array
from dataclasses import dataclass

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from memdiag.system.elfread import section_bytes

# Bounds on what one module's tables cost memdiag (a mapped file is the target's choice: a library
# may claim any number of symbols). Symbols are kept compact (SymbolTable: ~45 bytes and the name's
# a symbol; as objects they cost ~270: 2,000,000 symbols raised the peak RSS by 518 MiB before).
# 250,000 functions is more than any module seen here has (node 78,000; libjvm's debug file
# ~90,000): such a table holds ~20 MiB, its reading peaks at ~+70 MiB (the names read, the by-address
# map while it is built). Rows past MAX_SYMBOL_ROWS of a table are not read (24 bytes each, read
# _ROWS_AT_ONCE at a time), nor names past MAX_STRTAB_BYTES (held while a table is read). Measured:
# tests/unit/test_hostile_symbol_inputs.py.
MAX_SYMBOLS = 250_000
MAX_SYMBOL_ROWS = 1_000_000
MAX_STRTAB_BYTES = 32 << 20
# a name's length is the file's to choose: C++'s longest mangled names run to a few KiB; past that a
# name is cut (and every symbol could name the same 32 MiB string: 250,000 copies of it, before)
MAX_SYMBOL_NAME = 8192
# every module's tables together (elf_info keeps 256 files): 64 MiB is ~1,000,000 symbols of 40-char
# names, ten times a JVM's or node's process; past it a module keeps what fitted, and says so
MAX_HELD_BYTES = 64 << 20
MAX_NAME_CHARS = 32 << 20  # the names kept of one module, all told (node's 78,000: 5 MiB)
_ROWS_AT_ONCE = 65_536  # rows read and unpacked at a time (1.5 MiB)


@dataclass(frozen=True, slots=True)  # slots: 40 bytes less each, of 8,400 in a C program's diagnosis (0.3 MiB)
class Symbol:
    address: int
    size: int
    name: str


# the codes symbol_rows gives a symbol's type and binding (the ELF's own)
STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
STB_GLOBAL, STB_WEAK = 1, 2
EXPORTED = 1  # a SymbolTable row's flag: .dynsym's global or weak (what other modules may bind to)
_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size


def symbol_rows(elf: ELFFile, sec: SymbolTableSection):
    """(name, value, size, type, bind, shndx) of each symbol of a symbol table. A 64-bit
    little-endian table is unpacked in bulk (pyelftools parses a symbol at a time: node's 78,000
    took 32 s on a loaded host, this ~0.3 s); other layouts go through pyelftools."""
    if elf.elfclass == 64 and elf.little_endian and sec["sh_entsize"] != _SYM64.size:
        raise ELFError(f"{sec.name}: {sec['sh_entsize']}-byte symbols (an x86-64 file's are {_SYM64.size})")
    if elf.elfclass != 64 or not elf.little_endian:  # 32-bit or big-endian: not what memdiag traces
        for sym in itertools.islice(sec.iter_symbols(), MAX_SYMBOL_ROWS):
            shndx = 0 if sym["st_shndx"] == "SHN_UNDEF" else -1
            info = sym.entry["st_info"]
            yield sym.name, sym["st_value"], sym["st_size"], _type_code(info["type"]), _bind_code(info["bind"]), shndx
        return
    names = section_bytes(elf, elf._get_section_header(sec["sh_link"]), MAX_STRTAB_BYTES)
    hdr = sec.header
    for first in range(0, min(hdr["sh_size"] // _SYM64.size, MAX_SYMBOL_ROWS), _ROWS_AT_ONCE):
        rows = section_bytes(elf, hdr, _ROWS_AT_ONCE * _SYM64.size, skip=first * _SYM64.size)
        whole = rows[: len(rows) - len(rows) % _SYM64.size]
        for name_at, info, _other, shndx, value, size in _SYM64.iter_unpack(whole):
            end = names.find(b"\0", name_at, name_at + MAX_SYMBOL_NAME + 1)
            if not name_at or name_at >= len(names):
                name = ""
            elif end < 0:  # longer than any name kept (or no end at all): cut
                name = names[name_at : name_at + MAX_SYMBOL_NAME].decode(errors="replace") + "…"
            else:
                name = names[name_at:end].decode(errors="replace")
            yield name, value, size, info & 0xF, info >> 4, shndx
        if len(rows) < _ROWS_AT_ONCE * _SYM64.size:
            return  # the file ends before the table its header claims


def _type_code(kind: str) -> int:
    return {"STT_OBJECT": STT_OBJECT, "STT_FUNC": STT_FUNC, "STT_LOOS": STT_GNU_IFUNC}.get(kind, -1)


def _bind_code(bind: str) -> int:
    return {"STB_GLOBAL": STB_GLOBAL, "STB_WEAK": STB_WEAK}.get(bind, 0)


_HELD = [0]  # bytes of every finished SymbolTable alive (all modules, all processes)
_ROW_BYTES = 8 + 8 + 8 + 1  # a row's address, size, name offset and flag
_INDEX_BYTES = 8 + 4  # an address and its row


def _give_back(size: int) -> None:
    _HELD[0] -= size


class SymbolTable:
    """One module's symbols of a kind, compact: a row per symbol read (address, size, where its name
    is in one bytes blob, a flag), and the rows that name each address, by address. ~45 bytes a
    symbol plus its name's, where a Symbol object, its str and two dict entries cost ~270 (2,000,000
    symbols: 518 MiB of peak RSS before). A Symbol is made when one is looked up."""

    def __init__(self):
        self._row_address, self._row_size = array("Q"), array("Q")
        self._row_name = array("Q")  # offset of the name in _blob (each name ends with a NUL)
        self._flags = bytearray()
        self._blob = bytearray(b"\0")
        self._at: dict[int, int] | None = {}  # while rows are added: address -> the row that names it
        self.addresses = array("Q")  # by address, the row of each
        self._rows = array("L")
        self.complete = True  # False: rows past a bound were not kept

    def __len__(self) -> int:
        return len(self.addresses)

    def add(self, address: int, size: int, name: str, flag: int = 0, better=None) -> bool:
        """A symbol read; better(new, known): whether a new name wins an address named already (None:
        the first stays). False once a bound is reached: the table keeps no more."""
        known = self._at.get(address)
        full = known is None and len(self._at) >= MAX_SYMBOLS
        grown = self._bytes() + _ROW_BYTES + _INDEX_BYTES + len(name) + 1  # with this row
        if full or len(self._blob) + len(name) > MAX_NAME_CHARS or _HELD[0] + grown > MAX_HELD_BYTES:
            self.complete = False
            return False
        row = len(self._row_address)
        self._row_address.append(address)
        self._row_size.append(size)
        self._row_name.append(len(self._blob))
        self._flags.append(flag)
        self._blob += name.encode(errors="replace") + b"\0"
        if known is None or (better is not None and better(name, self._name(known))):
            self._at[address] = row
        return True

    def finish(self) -> SymbolTable:
        """No more rows: the by-address index made, the building's map let go."""
        for address in sorted(self._at):
            self.addresses.append(address)
            self._rows.append(self._at[address])
        self._at = None  # (the blob stays a bytearray: a bytes copy of 32 MiB of names would double them)
        size = self._bytes()
        _HELD[0] += size
        weakref.finalize(self, _give_back, size)  # given back when the module's reader goes (forget())
        return self

    def _bytes(self) -> int:
        indexed = len(self._at) if self._at is not None else len(self.addresses)  # to be, while rows are added
        return len(self._blob) + _ROW_BYTES * len(self._row_address) + _INDEX_BYTES * indexed

    def _name(self, row: int) -> str:
        at = self._row_name[row]
        return self._blob[at : self._blob.index(b"\0", at)].decode(errors="replace")

    def _symbol(self, row: int) -> Symbol:
        return Symbol(self._row_address[row], self._row_size[row], self._name(row))

    def symbol(self, i: int) -> Symbol:
        """The symbol of the i-th address."""
        return self._symbol(self._rows[i])

    def covering(self, vaddr: int, min_size: int = 0) -> tuple[Symbol, int] | None:
        """The symbol at or below vaddr that holds it (a size 0 holds everything up to the next with
        min_size 0, only its own address with 1), and vaddr's offset in it."""
        i = bisect.bisect_right(self.addresses, vaddr) - 1
        if i < 0:
            return None
        row = self._rows[i]
        address, size = self._row_address[row], max(self._row_size[row], min_size)
        if size and vaddr >= address + size:
            return None
        return self._symbol(row), vaddr - address

    def named(self, name: str, flag: int | None = None) -> Symbol | None:
        """The first row of that name (with `flag` set, where given)."""
        needle = b"\0" + name.encode(errors="replace") + b"\0"
        at = self._blob.find(needle)
        while at >= 0:
            row = bisect.bisect_left(self._row_name, at + 1)
            if flag is None or self._flags[row] & flag:
                return self._symbol(row)
            at = self._blob.find(needle, at + 1)
        return None
