"""ELF files as the symbolizer and the unwinder need them: function symbols (held in
probes/symtab.py's tables), load bias, and the .eh_frame call-frame table. Parsed once per file
(cached); pyelftools does the ELF and DWARF work."""

from __future__ import annotations

import bisect
import errno
import functools
import itertools
import os
import stat
import struct
import sys
from array import array

from elftools.common.exceptions import ELFError
from elftools.dwarf.callframe import FDE, CallFrameInfo
from elftools.dwarf.structs import DWARFStructs
from elftools.elf.sections import SymbolTableSection
from memdiag.system.elfread import SectionWindow, open_elf, section_bytes, section_headers, segment_headers
from memdiag.system.safefile import open_regular

from .lines import DEBUG_ROOT, LineTable, NoLines, crc_matches, debuglink
from .mapping import Mapping
from .symtab import (
    EXPORTED,
    MAX_HELD_BYTES,
    MAX_NAME_CHARS,
    MAX_SYMBOL_ROWS,
    MAX_SYMBOLS,
    STB_GLOBAL,
    STB_WEAK,
    STT_FUNC,
    STT_OBJECT,
    Symbol,
    SymbolTable,
    symbol_rows,
)

PAGE_MASK = ~(os.sysconf("SC_PAGE_SIZE") - 1)  # a segment is mapped from the page its offset falls in
PF_X = 1  # a segment's flag: executable

# Bounds on what one module's parse costs memdiag beyond its symbol tables' (probes/symtab.py):
# relocations past MAX_RELOCATIONS are not read (pyelftools parses one at ~20 us).
MAX_RELOCATIONS = 200_000
# call-frame information: .eh_frame_hdr's index is read as arrays, up to MAX_FDES entries (libc has
# 3,700, the largest programs ~500,000); without an index every FDE is parsed by pyelftools, ~460
# bytes of objects per byte of .eh_frame (libc's: ~120 MiB), so only a small one is
MAX_FDES = 1_000_000
MAX_EH_FRAME_UNINDEXED = 256 << 10
MAX_FDE_BYTES = 1 << 20
# bytes of code read at once (a function's whole body, to disassemble): the largest functions seen
# are ~100 KiB; a symbol claiming more is read (and disassembled) this far
MAX_READ = 1 << 20  # one function's call-frame rules (real ones: tens of bytes to a few KiB)
MAX_NOTE = 200  # characters of a note: an exception's text may quote the file's bytes
MAX_NOTES = 64  # modules named in NOTES: a target mapping 10,000 corrupt files gets 64 lines, not 10,000

BOUND_NOTE = (
    f"not every symbol kept: past memdiag's bounds ({MAX_SYMBOLS:,} functions or {MAX_NAME_CHARS >> 20} MiB"
    f" of names a module, {MAX_HELD_BYTES >> 20} MiB of symbol tables in all)"
)
# path -> why this module has no symbols (or not all): each parse failure of one module, in one line,
# for the trail (diagnose/engine.py) and `memdiag probe` (taken with take_notes())
NOTES: dict[str, str] = {}


def note_module(path: str, why: str) -> None:
    """A module's parse failure, once, in one line (the first of its failures)."""
    if path not in NOTES and len(NOTES) < MAX_NOTES:
        NOTES[path] = " ".join(why.split())[:MAX_NOTE]


_note = note_module


def _failure(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def take_notes() -> list[str]:
    """`PATH: no symbols (why)` lines noted since the last call, the notes cleared."""
    lines = [f"{path}: {why}" for path, why in NOTES.items()]
    NOTES.clear()
    return lines


def _or(default):
    """The boundary of one module's parse: a corrupt or lying file raises anything (ValueError,
    struct.error, ELFError, IndexError, OverflowError, MemoryError from a size it claims...), and
    any of it means that module answers `default()` (no symbols, no name), noted once in NOTES;
    never the end of a diagnosis."""

    def wrap(fn):
        @functools.wraps(fn)
        def guarded(self, *args, **kwargs):
            try:
                return fn(self, *args, **kwargs)
            except Exception as e:  # noqa: BLE001  (any failure of a hostile file's parse, see above)
                _note(self.path, f"no symbols ({fn.__name__.strip('_')}: {_failure(e)})")
                return default()

        return guarded

    return wrap


def _none():
    return None


ELF_MAGIC = b"\x7fELF"


class NotElf(OSError):
    """A mapped file that is no ELF file at all: not a corrupt module, nothing said of it."""


class ElfInfo:
    def __init__(self, path: str, expect: tuple[int, int] | None = None):
        self.path = path
        # kept open: pyelftools reads lazily. Never blocking, a regular file only, and the inode
        # looked at where one was (a path of the target's can be a FIFO or another file by now)
        self._file = os.fdopen(open_regular(path, expect), "rb")
        try:
            if self._file.read(len(ELF_MAGIC)) != ELF_MAGIC:
                # a mapped data file (a locale archive, gconv's cache): no code, no symbols to miss
                raise NotElf(errno.ENOEXEC, "not an ELF file", path)
            self._file.seek(0)
            self.elf = open_elf(self._file)
            self.loads = [s for s in segment_headers(self.elf) if s["p_type"] == "PT_LOAD"]
        except BaseException:
            self._file.close()
            raise
        self._functions: SymbolTable | None = None
        # each FDE's first address, sorted, and where it is in .eh_frame: arrays, not a list of
        # tuples (libc's 3,700 FDEs: 0.57 MiB of Python objects as tuples, measured; 58 KiB so)
        self._fde_starts: array | None = None
        self._fde_offsets = array("q")
        self._cfi: CallFrameInfo | None = None
        self._objects: SymbolTable | None = None
        self._allocated: list[tuple[int, int, str]] | None = None  # (start, end, name) of SHF_ALLOC sections
        self._build_id: str | None | bool = False  # False: not read yet
        self._lines: LineTable | None | bool = False  # False: not looked for yet

    def close(self) -> None:
        """The file let go (a reader from passing_elf_info, once done with it)."""
        self._file.close()

    @property
    def identity(self) -> tuple[int, int]:
        """(device, inode) of the very file read: another reader opens it expecting these."""
        st = os.fstat(self._file.fileno())
        return st.st_dev, st.st_ino

    # --- addresses --------------------------------------------------------------------------
    def bias(self, mapping: Mapping) -> int | None:
        """Runtime address minus ELF virtual address, for a mapping of this file."""
        # The kernel maps each segment from the page its file offset falls in, and a page may hold
        # the end of one segment and the start of the next (lld and rustc's linking pack them: a
        # Rust binary's code starts 0x40 into the page the read-only data ends in). The mapping is
        # the segment it was made for: the one of its permissions, else the later one.
        found = [
            seg
            for seg in self.loads
            if (seg["p_offset"] & PAGE_MASK) <= mapping.offset < seg["p_offset"] + max(seg["p_filesz"], 1)
        ]
        if not found:
            return None
        same = [seg for seg in found if bool(seg["p_flags"] & PF_X) == mapping.executable]
        seg = (same or found)[-1]
        return mapping.start - (seg["p_vaddr"] + (mapping.offset - seg["p_offset"]))

    def file_offset(self, vaddr: int) -> int | None:
        for seg in self.loads:
            if seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
                return seg["p_offset"] + (vaddr - seg["p_vaddr"])
        return None

    @_or(_none)
    def read_at(self, vaddr: int, size: int) -> bytes | None:
        """The file's bytes at vaddr, at most MAX_READ of them (a symbol's size is the file's claim)."""
        off = self.file_offset(vaddr)
        if off is None:
            return None
        self._file.seek(off)
        return self._file.read(min(size, MAX_READ))

    # --- symbols ------------------------------------------------------------------------------
    @_or(_none)
    def build_id(self) -> str | None:
        """The GNU build id, read once (the code facts name the file by it at every fact asked)."""
        if self._build_id is False:
            self._build_id = self._read_build_id()
        return self._build_id  # type: ignore[return-value]

    def _read_build_id(self) -> str | None:
        sec = self.elf.get_section_by_name(".note.gnu.build-id")
        if sec is None:
            return None
        for note in sec.iter_notes():
            if note["n_type"] == "NT_GNU_BUILD_ID":
                return note["n_desc"]
        return None

    def debug_file(self) -> ElfInfo | None:
        """The detached debug symbols (distro -dbg/-dbgsym packages), found by build id."""
        bid = self.build_id()
        if not bid or len(bid) < 3:
            return None
        path = os.path.join(DEBUG_ROOT, ".build-id", bid[:2], bid[2:] + ".debug")
        return elf_info(path) if os.path.exists(path) else None

    def lines(self, module: str | None = None) -> LineTable | None:
        """The module's DWARF line tables (probes/lines.py): its own, else its debug file's, found by
        build id, else by its .gnu_debuglink under DEBUG_ROOT and the module's directory as the
        process maps it (module: that path). Looked for once; None where there are none."""
        if self._lines is False or (self._lines is not None and self._lines.closed):
            self._lines = None
            self._lines = self._find_lines(module)
        return self._lines  # type: ignore[return-value]

    @_or(_none)
    def _find_lines(self, module: str | None) -> LineTable | None:
        for source in (self, self.debug_file(), self._linked_debug_file(module)):
            if source is None:
                continue
            try:
                return LineTable(source)
            except NoLines as e:
                if str(e) != "no DWARF line table":
                    _note(self.path, f"no source lines ({source.path}: {e})")
        return None

    def _linked_debug_file(self, module: str | None) -> ElfInfo | None:
        """The debug file its .gnu_debuglink names, in DEBUG_ROOT under the module's directory (or
        DEBUG_ROOT itself), taken where its build id is the module's (or, without one, its CRC)."""
        link = debuglink(self.elf)
        if link is None or not module or not module.startswith("/"):
            return None
        name, crc = link
        for folder in (os.path.normpath(DEBUG_ROOT + os.path.dirname(module)), DEBUG_ROOT):
            path = os.path.join(folder, name)
            if not path.startswith(DEBUG_ROOT + "/"):
                continue  # the module's path is the target's: "/../.." leads nowhere here
            debug = elf_info(path) if os.path.isfile(path) else None
            if debug is None:
                continue
            mine = self.build_id()
            if (mine and debug.build_id() == mine) or (not mine and crc_matches(path, crc)):
                return debug
        return None

    @_or(_none)
    def _load_symbols(self) -> None:
        table = self._functions = SymbolTable()
        sources = [self]
        if not isinstance(self.elf.get_section_by_name(".symtab"), SymbolTableSection):
            debug = self.debug_file()  # stripped: static functions (_int_malloc) live there
            if debug is not None:
                sources.append(debug)
        # Exported names (.dynsym) first: an address shows as "malloc", not "__libc_malloc".
        try:
            for section in (".dynsym", ".symtab"):
                for source in sources:
                    sec = source.elf.get_section_by_name(section)
                    if not isinstance(sec, SymbolTableSection):
                        continue
                    for name, value, size, kind, bind, shndx in symbol_rows(source.elf, sec):
                        # functions only: an IFUNC symbol's value is its resolver (pyelftools, read before
                        # this, names type 10 STT_LOOS, so they never were taken), not the code it picks
                        if kind != STT_FUNC or not value or not name or shndx == 0:
                            continue
                        exported = EXPORTED if section == ".dynsym" and bind in (STB_GLOBAL, STB_WEAK) else 0
                        # Of aliases at one address, show the public name (calloc, not __libc_calloc).
                        if not table.add(value, size, name.split("@")[0], exported, _fewer_underscores):
                            break
        finally:
            table.finish()
        if not table.complete:
            _note(self.path, BOUND_NOTE)

    def plt_slots(self) -> dict[int, str]:
        """GOT slot address -> the function it is bound to (.rela.plt's jump slots): what a PLT
        stub's `jmp *slot(%rip)` goes to."""
        return self._slots(".rela.plt")

    def got_slots(self) -> dict[int, str]:
        """The PLT's jump slots and the GOT's other symbol slots (.rela.dyn): what a -fno-plt build's
        `call *slot(%rip)` goes to."""
        return {**self._slots(".rela.dyn"), **self.plt_slots()}

    @_or(dict)
    def _slots(self, section: str) -> dict[int, str]:
        slots: dict[int, str] = {}
        rela = self.elf.get_section_by_name(section)
        dynsym = self.elf.get_section_by_name(".dynsym")
        if rela is None or not isinstance(dynsym, SymbolTableSection):
            return slots
        for r in itertools.islice(rela.iter_relocations(), MAX_RELOCATIONS):
            if r["r_info_sym"]:
                slots[r["r_offset"]] = dynsym.get_symbol(r["r_info_sym"]).name.split("@")[0]
        return slots

    def _table(self) -> SymbolTable:
        if self._functions is None:
            self._load_symbols()
            if self._functions is None:  # the tables could not be read at all
                self._functions = SymbolTable().finish()
        return self._functions

    def symbols(self) -> list[Symbol]:
        """Every function symbol, by address (made here, one object each: for a look at all of them)."""
        table = self._table()
        return [table.symbol(i) for i in range(len(table))]

    def symbol_named(self, name: str, exported_only: bool = False) -> Symbol | None:
        """A defined function by name (versioned names such as malloc@@GLIBC_2.2.5 included);
        exported_only: only what the dynamic linker can bind other modules to."""
        table = self._table()
        if exported_only and table.named(name, EXPORTED) is None:
            return None
        return table.named(name)

    def lookup(self, vaddr: int) -> tuple[Symbol, int] | None:
        return self._table().covering(vaddr)

    def _symbol_sources(self) -> list[ElfInfo]:
        if isinstance(self.elf.get_section_by_name(".symtab"), SymbolTableSection):
            return [self]
        debug = self.debug_file()  # stripped: static variables live in the debug file
        return [self, debug] if debug is not None else [self]

    @_or(_none)
    def object_at(self, vaddr: int) -> tuple[Symbol, int] | None:
        """The data symbol (a global or static variable) that holds vaddr, and the offset in it."""
        if self._objects is None:
            table = self._objects = SymbolTable()
            try:
                for source in self._symbol_sources():
                    for section in (".dynsym", ".symtab"):
                        sec = source.elf.get_section_by_name(section)
                        if not isinstance(sec, SymbolTableSection):
                            continue
                        for name, value, size, kind, _bind, shndx in symbol_rows(source.elf, sec):
                            if kind != STT_OBJECT or not value or not name or shndx == 0:
                                continue
                            if not table.add(value, size, name):
                                break
            finally:
                table.finish()
        return self._objects.covering(vaddr, min_size=1)

    @_or(list)
    def loads_and_tls(self) -> list:
        """The PT_LOAD segments and the PT_TLS one, if any."""
        return [s for s in segment_headers(self.elf) if s["p_type"] in ("PT_LOAD", "PT_TLS")]

    @_or(_none)
    def tls_object_at(self, offset: int) -> Symbol | None:
        """The thread-local variable (STT_TLS) at an offset into the module's TLS block."""
        for source in self._symbol_sources():
            sec = source.elf.get_section_by_name(".symtab")
            if not isinstance(sec, SymbolTableSection):
                continue
            for sym in itertools.islice(sec.iter_symbols(), MAX_SYMBOL_ROWS):
                inside = sym["st_value"] <= offset < sym["st_value"] + max(sym["st_size"], 1)
                if sym["st_info"]["type"] == "STT_TLS" and sym.name and inside:
                    return Symbol(sym["st_value"], sym["st_size"], sym.name)
        return None

    @_or(_none)
    def section_of(self, vaddr: int) -> str | None:
        """The name of the allocated section that holds vaddr (.data, .bss, .got, ...)."""
        # read once: pyelftools parses every section header again on each pass (a scan naming the
        # anchor of 23,400 registry blocks spent 17 s here, 70 s under a profiler)
        if self._allocated is None:
            self._allocated = [
                (hdr["sh_addr"], hdr["sh_addr"] + hdr["sh_size"], name)
                for _i, hdr, name in section_headers(self.elf)
                if hdr["sh_flags"] & 0x2  # SHF_ALLOC
            ]
        return next((name for lo, hi, name in self._allocated if lo <= vaddr < hi), None)

    # --- call frame information -----------------------------------------------------------
    def _fde_index(self) -> None:
        """Where each FDE starts. From .eh_frame_hdr's sorted table when the file has one (what
        the runtime unwinder searches): FDEs are then parsed one at a time, when an address needs
        one. Parsing all of libc's .eh_frame with pyelftools costs ~120 MiB of Python objects
        (measured: a faults run peaked at 170 MiB with it, 55 MiB without)."""
        if self._fde_starts is not None:
            return
        self._fde_starts, self._fde_offsets = array("q"), array("q")
        starts, offsets = array("q"), array("q")
        try:
            # .eh_frame alone, read from the file where asked: pyelftools' get_dwarf_info reads every
            # .debug_* section whole into memory first (a library's debug info, or a sparse 10 GiB
            # one a target made, only to unwind through it)
            eh = self.elf.get_section_by_name(".eh_frame")
            if eh is None or eh["sh_type"] == "SHT_NOBITS":
                return
            stream = SectionWindow(self._file, eh["sh_offset"], eh["sh_size"])
            address, size = eh["sh_addr"], stream.size
            width = self.elf.elfclass // 8
            structs = DWARFStructs(little_endian=self.elf.little_endian, dwarf_format=32, address_size=width)
            self._cfi = CallFrameInfo(stream, size, address, structs, for_eh_frame=True)
            table = self._eh_frame_hdr()
            if table is not None:
                base, lows, fdes = table
                starts.extend(base + lo for lo in lows)
                offsets.extend(base + fde - address for fde in fdes)
            elif size > MAX_EH_FRAME_UNINDEXED:
                note_module(self.path, f"no unwinding rules (.eh_frame of {size:,} bytes without an index)")
            else:  # no usable index: every FDE, parsed once
                fdes = []
                for entry in self._cfi.get_entries():
                    if isinstance(entry, FDE):
                        lo = entry.header["initial_location"]
                        fdes.append((lo, lo + entry.header["address_range"], entry.offset))
                fdes.sort()
                starts.extend(f[0] for f in fdes)
                offsets.extend(f[2] for f in fdes)
        except (ELFError, Exception):  # a malformed .eh_frame must not abort a probe
            starts, offsets = array("q"), array("q")
        self._fde_starts, self._fde_offsets = starts, offsets

    def _eh_frame_hdr(self) -> tuple[int, array, array] | None:
        """(the section's address, initial locations, FDE addresses) of .eh_frame_hdr's table, the
        two columns relative to that address, as arrays (a table of a million entries is 8 MiB
        so, ~100 as pairs of ints), for the encoding every toolchain writes (table datarel|sdata4);
        None otherwise. At most MAX_FDES entries."""
        hdr = self.elf.get_section_by_name(".eh_frame_hdr")
        if hdr is None:
            return None
        data = section_bytes(self.elf, hdr.header, 12 + 8 * MAX_FDES)
        if len(data) < 12 or data[0] != 1 or data[1] != 0x1B or data[2] != 0x03 or data[3] != 0x3B:
            return None
        (count,) = struct.unpack_from("<I", data, 8)
        if len(data) < 12 + 8 * count:
            return None
        pairs = array("i")
        pairs.frombytes(data[12 : 12 + 8 * count])
        if sys.byteorder != "little":
            pairs.byteswap()
        return hdr["sh_addr"], pairs[0::2], pairs[1::2]

    @_or(_none)
    def cfi_row(self, vaddr: int) -> dict | None:
        """The decoded CFA row that applies at vaddr, or None when no FDE covers it."""
        self._fde_index()
        i = bisect.bisect_right(self._fde_starts, vaddr) - 1
        if i < 0:
            return None
        try:
            fde = self._cfi._parse_entry_at(self._fde_offsets[i])  # pyelftools caches parsed entries
        except Exception:  # a malformed entry must not abort a probe
            return None
        if not isinstance(fde, FDE) or fde.header["length"] > MAX_FDE_BYTES:
            return None  # a rule table that long is no function's (its decoding would be the file's size)
        lo = fde.header["initial_location"]
        if not lo <= vaddr < lo + fde.header["address_range"]:
            return None
        table = _decoded(fde)
        row = None
        for r in table:
            if r["pc"] <= vaddr:
                row = r
            else:
                break
        return row


def _underscores(name: str) -> int:
    return len(name) - len(name.lstrip("_"))


def _fewer_underscores(new: str, known: str) -> bool:
    return _underscores(new) < _underscores(known)


@functools.lru_cache(maxsize=4096)
def _decoded(fde: FDE) -> list[dict]:
    return fde.get_decoded().table


@functools.lru_cache(maxsize=256)
def _open(path: str, mtime_ns: int, inode: tuple[int, int]) -> ElfInfo | None:
    return passing_elf_info(path, inode)


def forget() -> None:
    """Drop every parsed file elf_info keeps, and their decoded unwind tables."""
    _open.cache_clear()
    _decoded.cache_clear()


def passing_elf_info(path: str, expect: tuple[int, int] | None = None) -> ElfInfo | None:
    """The parsed file at path, not kept in elf_info's cache: for a file looked at once and let go
    (its reader holds ~90 KiB of pyelftools' structures, its symbols more). expect: the (device,
    inode) the file must be."""
    try:
        return ElfInfo(path, expect)
    except OSError:
        return None
    except Exception as e:  # noqa: BLE001  (a corrupt or hostile file: that module has no symbols, see _or)
        _note(path, f"no symbols (its headers: {_failure(e)})")
        return None


def elf_info(path: str | None) -> ElfInfo | None:
    """The parsed file at path (None: no file, as AddressSpace.file_path says of an unmatched one).
    Cached by path and inode: a /proc/PID/map_files name can come back for another process."""
    if path is None:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return _open(path, st.st_mtime_ns, (st.st_dev, st.st_ino))
