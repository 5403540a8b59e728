"""Source lines of native frames: the file:line an address of a module was compiled from, read from
DWARF line tables (.debug_line), the module's own or its debug file's (found by build id under
/usr/lib/debug/.build-id, else by its .gnu_debuglink under /usr/lib/debug), on this host only: no
debuginfod, nothing fetched. pyelftools decodes the DWARF; this module says which line program to
decode and keeps what it read compact.

A compressed section (as distributions ship debug files) is unpacked into memory; an uncompressed
one (a -g build's own) is read from the file where pyelftools asks, never held. Only what a report
shows is looked up (the frames of the stacks a probe keeps, the culprit's
among them: probes/stacks.py sourced), and a module's line programs are decoded one compilation
unit at a time, as an address needs one: .debug_aranges (or the units' own ranges) says which unit
holds an address. Everything read is bounded, whatever the file claims: each section held at most
MAX_SECTION_BYTES (decompressed as far, never further), one line program at most MAX_PROGRAM_BYTES,
a module's programs MAX_DECODED_BYTES in all, every module's sections MAX_HELD_BYTES together.
Measured (glibc 2.36's debug file, zlib-compressed): malloc's line found in 0.14 s (its sections
unpacked, malloc.c's line program of 20 KiB, 12,183 rows, decoded), the next in its unit in 1 ms."""

from __future__ import annotations

import bisect
import os
import struct
import weakref
import zlib
from array import array
from dataclasses import dataclass

from elftools.dwarf.dwarfinfo import DebugSectionDescriptor, DwarfConfig, DWARFInfo
from memdiag.system.elfread import SectionWindow, section_bytes, section_headers

MAX_SECTION_BYTES = 64 << 20  # one DWARF section (glibc's .debug_info: 5.5 MiB; a browser's: GiBs, skipped)
MAX_PROGRAM_BYTES = 1 << 20  # one unit's line program (malloc.c's: 20 KiB, 12,183 rows)
MAX_DECODED_BYTES = 4 << 20  # a module's line programs decoded, all told (pyelftools: ~6 us a byte)
MAX_HELD_BYTES = 256 << 20  # every module's sections held at once
MAX_UNITS = 100_000  # compilation units looked at for their ranges, where .debug_aranges does not say
MAX_FILE_NAME = 200  # characters of a file's name kept (the name is the binary's to choose)
DEBUG_ROOT = "/usr/lib/debug"
SHF_COMPRESSED = 0x800
_PIECE = 256 << 10  # compressed bytes unpacked at a time
_CHDR64 = struct.Struct("<IIQQ")  # Elf64_Chdr: type, reserved, size, alignment
ELFCOMPRESS_ZLIB = 1

# entries of .debug_info walked for the calls a unit inlined (malloc.c's unit: 5,000 in 0.05 s), one
# unit's and a module's; past them a frame has the line table's line (the inlined code's)
MAX_DIES = 200_000
MAX_MODULE_DIES = 1_000_000
_CODE = frozenset({"DW_TAG_subprogram", "DW_TAG_lexical_block", "DW_TAG_inlined_subroutine"})  # with ranges
# entries that hold no code of their own to look into (types, variables, parameters)
_LEAVES = frozenset(
    {"DW_TAG_base_type", "DW_TAG_pointer_type", "DW_TAG_typedef", "DW_TAG_variable", "DW_TAG_formal_parameter",
     "DW_TAG_enumeration_type", "DW_TAG_array_type", "DW_TAG_member", "DW_TAG_subroutine_type"}
)  # fmt: skip
_SECTIONS = (
    ".debug_info",
    ".debug_abbrev",
    ".debug_aranges",
    ".debug_line",
    ".debug_str",
    ".debug_line_str",
    ".debug_ranges",
    ".debug_rnglists",
)
_HELD = [0]
_OPEN: weakref.WeakSet = weakref.WeakSet()  # every table with its sections held (close_all)


def _give_back(size: int) -> None:
    _HELD[0] -= size


def _children(die) -> list:
    """A debug entry's children, in the file's order: at most MAX_DIES, and none past one that does
    not lie after the one before it (pyelftools follows a child's DW_AT_sibling link wherever it
    points: a link pointing back, in a hostile file, repeats the same entries for ever)."""
    out = []
    last = die.offset
    for child in die.iter_children():
        if child.offset <= last or len(out) >= MAX_DIES:
            break
        last = child.offset
        out.append(child)
    return out


class NoLines(Exception):
    """Why a module has no line table memdiag can read (its note)."""


@dataclass
class _Program:
    """One unit's line rows, by address: where each row starts, its line (0: no line, as an end of
    sequence is), its file's index into names."""

    addresses: array
    lines: array
    files: array
    names: list[str]

    def at(self, vaddr: int) -> tuple[str, int] | None:
        i = bisect.bisect_right(self.addresses, vaddr) - 1
        if i < 0 or not self.lines[i]:
            return None
        f = self.files[i]
        return (self.names[f], self.lines[i]) if f < len(self.names) else None


class LineTable:
    """One module's DWARF line tables (`source(vaddr)`), read from the ELF file given (the module or
    its debug file); units decoded when an address falls in one, kept."""

    def __init__(self, elf):
        self.elf = elf
        self._dwarf = self._open(elf.elf)
        self._aranges = None
        self._units: list[tuple[int, int, int]] | None = None  # (low, high, unit offset), where no aranges
        self._programs: dict[int, _Program | None] = {}
        self._calls: dict[tuple[int, int], tuple[int, int] | None] = {}  # (unit, address) -> its call site
        self._dies = 0  # walked, all units
        self._decoded = 0
        self.note: str | None = None  # a bound reached (said once, in the module's notes)

    def _open(self, elf) -> DWARFInfo:
        found = {  # a section with no bytes in the file (SHT_NOBITS, as a debug file's code is) is none
            name: hdr for _i, hdr, name in section_headers(elf) if name in _SECTIONS and hdr["sh_type"] != "SHT_NOBITS"
        }
        if ".debug_line" not in found or ".debug_info" not in found or ".debug_abbrev" not in found:
            raise NoLines("no DWARF line table")
        sections, held = {}, 0
        for name, hdr in found.items():
            if not hdr["sh_flags"] & SHF_COMPRESSED and name != ".debug_aranges":
                # read from the file where pyelftools asks (a -g build's own sections: nothing held)
                window = SectionWindow(elf.stream, hdr["sh_offset"], hdr["sh_size"])
                sections[name] = DebugSectionDescriptor(window, name, hdr["sh_offset"], window.size, 0)
                continue
            data = _section_data(elf, hdr)  # unpacked (or .debug_aranges, which pyelftools parses whole)
            held += len(data)
            if _HELD[0] + held > MAX_HELD_BYTES:
                raise NoLines(f"over memdiag's bound on debug sections held ({MAX_HELD_BYTES >> 20} MiB)")
            sections[name] = DebugSectionDescriptor(_Memory(data), name, hdr["sh_offset"], len(data), 0)
        _HELD[0] += held
        self._give_back = weakref.finalize(self, _give_back, held)
        _OPEN.add(self)
        config = DwarfConfig(little_endian=elf.little_endian, default_address_size=elf.elfclass // 8, machine_arch="")
        get = sections.get
        return DWARFInfo(
            config=config,
            debug_info_sec=get(".debug_info"),
            debug_aranges_sec=get(".debug_aranges"),
            debug_abbrev_sec=get(".debug_abbrev"),
            debug_frame_sec=None,
            eh_frame_sec=None,
            debug_str_sec=get(".debug_str"),
            debug_loc_sec=None,
            debug_ranges_sec=get(".debug_ranges"),
            debug_line_sec=get(".debug_line"),
            debug_pubtypes_sec=None,
            debug_pubnames_sec=None,
            debug_addr_sec=None,
            debug_str_offsets_sec=None,
            debug_line_str_sec=get(".debug_line_str"),
            debug_loclists_sec=None,
            debug_rnglists_sec=get(".debug_rnglists"),
            debug_sup_sec=None,
            gnu_debugaltlink_sec=None,
            debug_types_sec=None,
        )

    @property
    def closed(self) -> bool:
        return self._dwarf is None

    def close(self) -> None:
        """Its sections and what was decoded of them let go (glibc's: 8 MiB of sections, ~15 MiB of
        memdiag's RSS while held); a module's table is read again where a frame of it is next asked."""
        self._dwarf = self._aranges = self._units = None
        self._programs, self._calls = {}, {}
        self._give_back()

    def source(self, vaddr: int) -> tuple[str, int] | None:
        """(file name, line) of the code at vaddr (the file's own address) in the function that holds
        it, or None: where the compiler inlined a call there (Box::new, a C++ template, a static
        helper), the line of that call in the function, not the line in the code it inlined (the
        line table's own: alloc.rs:95 for every Rust allocation), as `addr2line -i` ends with."""
        unit = self._unit_of(vaddr)
        if unit is None:
            return None
        if unit not in self._programs:
            self._programs[unit] = self._decode(unit)
        program = self._programs[unit]
        if program is None:
            return None
        key = (unit, vaddr)
        if key not in self._calls:
            self._calls[key] = self._call_site(unit, vaddr)
        call = self._calls[key]
        if call is not None:
            file, line = call
            return (program.names[file], line) if 0 <= file < len(program.names) and line else None
        return program.at(vaddr)

    def _call_site(self, unit: int, vaddr: int) -> tuple[int, int] | None:
        """(file index, line) of the call the function holding vaddr makes to the outermost code the
        compiler inlined there (DW_TAG_inlined_subroutine), or None: the unit's entries walked down
        to that function (the others' subtrees skipped where GCC's sibling links allow; rustc's have
        none, their entries are all read, once), then its blocks to the inlined call holding vaddr.
        The entries read stay (pyelftools' cache) until the table is closed."""
        cu = self._dwarf.get_CU_at(unit)
        top = cu.get_top_DIE()
        base = top.attributes["DW_AT_low_pc"].value if "DW_AT_low_pc" in top.attributes else 0
        first = 0 if cu.header["version"] >= 5 else 1
        before = len(cu._dielist)
        try:
            dies = _children(top)
            seen = 0
            while dies:
                die = dies.pop()
                seen += 1
                over = seen > MAX_DIES or len(cu._dielist) > MAX_DIES
                if over or self._dies + len(cu._dielist) - before > MAX_MODULE_DIES:
                    self.note = (
                        f"inlined calls looked for in {MAX_DIES:,} entries of a unit's debug info, "
                        f"{MAX_MODULE_DIES:,} of a module's: past them a frame's line may be the inlined code's"
                    )
                    return None
                if die.tag == "DW_TAG_inlined_subroutine" and self._holds(die, cu, base, vaddr):
                    file, line = die.attributes.get("DW_AT_call_file"), die.attributes.get("DW_AT_call_line")
                    return (file.value - first, line.value) if file is not None and line is not None else None
                if die.tag in _CODE and not self._holds(die, cu, base, vaddr):
                    continue  # another function, or a block or inlined call elsewhere in this one
                if die.has_children and die.tag not in _LEAVES:
                    dies += _children(die)
            return None
        finally:
            self._dies += len(cu._dielist) - before

    def _holds(self, die, cu, base: int, vaddr: int) -> bool:
        """The entry's code holds vaddr (an entry without ranges, a declaration, holds nothing)."""
        return any(lo <= vaddr < hi for lo, hi in self._ranges(die, cu, base))

    def _ranges(self, die, cu, base: int) -> list[tuple[int, int]]:
        """The address ranges of an entry: low_pc/high_pc, or its range list (DW_AT_ranges)."""
        attrs = die.attributes
        if "DW_AT_low_pc" in attrs and "DW_AT_high_pc" in attrs:
            low, high = attrs["DW_AT_low_pc"].value, attrs["DW_AT_high_pc"]
            return [(low, high.value if high.form == "DW_FORM_addr" else low + high.value)]
        ranges = attrs.get("DW_AT_ranges")
        lists = self._dwarf.range_lists() if ranges is not None and ranges.form == "DW_FORM_sec_offset" else None
        if lists is None:
            return []
        out = []
        for entry in lists.get_range_list_at_offset(ranges.value, cu=cu)[:4096]:
            if hasattr(entry, "base_address"):
                base = entry.base_address
            elif entry.is_absolute:
                out.append((entry.begin_offset, entry.end_offset))
            else:
                out.append((base + entry.begin_offset, base + entry.end_offset))
        return out

    def _unit_of(self, vaddr: int) -> int | None:
        """The offset of the compilation unit whose code holds vaddr: .debug_aranges says, else the
        units' own low_pc/high_pc (compilers other than GCC often leave .debug_aranges out)."""
        if self._dwarf.debug_aranges_sec is not None:
            if self._aranges is None:
                self._aranges = self._dwarf.get_aranges()
            unit = self._aranges.cu_offset_at_addr(vaddr)
            if unit is not None:
                return unit
        if self._units is None:
            self._units = self._unit_ranges()
        i = bisect.bisect_right(self._units, (vaddr, 1 << 64, 0)) - 1
        if i >= 0 and self._units[i][0] <= vaddr < self._units[i][1]:
            return self._units[i][2]
        return None

    def _unit_ranges(self) -> list[tuple[int, int, int]]:
        out = []
        for n, cu in enumerate(self._dwarf.iter_CUs()):
            if n >= MAX_UNITS:
                self.note = f"only the first {MAX_UNITS:,} compilation units looked at"
                break
            top = cu.get_top_DIE()
            low, high = top.attributes.get("DW_AT_low_pc"), top.attributes.get("DW_AT_high_pc")
            if low is None or high is None:
                continue  # a unit of several ranges (DW_AT_ranges): not read here
            end = high.value if high.form == "DW_FORM_addr" else low.value + high.value
            out.append((low.value, end, cu.cu_offset))
        out.sort()
        return out

    def _decode(self, unit: int) -> _Program | None:
        """The unit's line program as compact rows (None: it has none, or it is past a bound)."""
        dwarf = self._dwarf
        cu = dwarf.get_CU_at(unit)
        top = cu.get_top_DIE()
        stmt = top.attributes.get("DW_AT_stmt_list")
        if stmt is None:
            return None
        program = dwarf._parse_line_program_at_offset(stmt.value, cu.structs)
        dwarf._linetable_cache.clear()  # pyelftools would keep every program's decoded rows as objects
        size = program.program_end_offset - program.program_start_offset
        if size > MAX_PROGRAM_BYTES or self._decoded + size > MAX_DECODED_BYTES:
            self.note = (
                f"a line program of {size:,} bytes not decoded (bounds: {MAX_PROGRAM_BYTES >> 20} MiB a unit, "
                f"{MAX_DECODED_BYTES >> 20} MiB a module)"
            )
            return None
        self._decoded += size
        header = program.header
        base = 0 if header["version"] >= 5 else 1  # file indexes count from 1 before DWARF 5
        names = [_file_name(e.name) for e in header["file_entry"]]
        # by address; of the rows at one address the last in the program's order (the ones before it
        # cover no byte), as addr2line reads it (binutils' and LLVM's; gdb prefers the last statement
        # start); and a sequence's end before the next sequence starting there
        states = [e.state for e in program.get_entries() if e.state is not None]
        order = sorted(range(len(states)), key=lambda i: _row_key(states[i], i))
        addresses, lines, files = array("Q"), array("I"), array("I")
        for i in order:
            s = states[i]
            file = s.file - base
            addresses.append(s.address)
            lines.append(0 if s.end_sequence else min(s.line, 0xFFFFFFFF))
            files.append(file if 0 <= file < len(names) else 0xFFFFFFFF)
        return _Program(addresses, lines, files, names)


def close_all() -> None:
    """Every module's line tables let go: once the stacks a probe keeps have their lines."""
    for table in list(_OPEN):
        table.close()


def _row_key(state, i: int) -> tuple:
    return (state.address, not state.end_sequence, i)


def _file_name(raw) -> str:
    """A file's name as a frame shows it: its last component, printable, without the characters a
    frame's text is parsed by (it is the binary's string, anything at all)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    base = text.rsplit("/", 1)[-1][:MAX_FILE_NAME]
    return "".join(c if c.isprintable() and c not in "()[], " else "_" for c in base) or "?"


class _Memory:
    """A section's bytes as the stream pyelftools reads (seek, tell, read), without a copy of them."""

    def __init__(self, data):
        self._data, self._at = memoryview(data), 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._at = max(0, {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: len(self._data)}[whence] + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, n: int = -1) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(len(self._data), self._at + n)
        data = bytes(self._data[self._at : end]) if end > self._at else b""
        self._at = max(self._at, end)
        return data


def _section_data(elf, hdr) -> bytes | bytearray:
    """A section's bytes, decompressed where it is SHF_COMPRESSED (zlib), at most MAX_SECTION_BYTES
    either way: a compressed section may claim, or unpack to, any size."""
    if hdr["sh_size"] > MAX_SECTION_BYTES and not hdr["sh_flags"] & SHF_COMPRESSED:
        raise NoLines(f"a debug section of {hdr['sh_size']:,} bytes (memdiag reads {MAX_SECTION_BYTES >> 20} MiB)")
    raw = section_bytes(elf, hdr, MAX_SECTION_BYTES)
    if not hdr["sh_flags"] & SHF_COMPRESSED:
        return raw
    if elf.elfclass != 64 or not elf.little_endian or len(raw) < _CHDR64.size:
        raise NoLines("a compressed debug section memdiag does not read")
    kind, _reserved, size, _align = _CHDR64.unpack_from(raw)
    if kind != ELFCOMPRESS_ZLIB:
        raise NoLines(f"debug sections compressed other than by zlib (type {kind})")
    if size > MAX_SECTION_BYTES:
        raise NoLines(f"a debug section of {size:,} bytes unpacked (memdiag reads {MAX_SECTION_BYTES >> 20} MiB)")
    # unpacked a piece at a time into a buffer of the size the header says (as far as 4 times the
    # packed bytes: past that the claim is believed as the bytes come), no copy of the input, no
    # buffer regrown (glibc's .debug_info, 2.2 MiB to 5.5 MiB: +5 MiB of peak RSS at once before)
    packed = memoryview(raw)[_CHDR64.size :]
    out, at = bytearray(min(size, 4 * len(packed))), 0
    unpacker = zlib.decompressobj()
    for piece in range(0, len(packed), _PIECE):
        data = unpacker.decompress(packed[piece : piece + _PIECE], size - at + 1)
        if at + len(data) > size or unpacker.unconsumed_tail:
            raise NoLines(f"a debug section unpacking past the {size:,} bytes it claims")
        out[at : at + len(data)] = data
        at += len(data)
    del out[at:]  # it unpacked to less than it said
    return out


def debuglink(elf) -> tuple[str, int] | None:
    """(file name, CRC-32) of the module's .gnu_debuglink, or None."""
    hdr = next((h for _i, h, name in section_headers(elf) if name == ".gnu_debuglink"), None)
    if hdr is None:
        return None
    data = section_bytes(elf, hdr, 4096)
    end = data.find(b"\0")
    if end <= 0:
        return None
    name = data[:end].decode(errors="replace")
    at = (end + 4) & ~3  # the CRC follows the name, 4-byte aligned
    if len(data) < at + 4 or "/" in name or name in (".", ".."):
        return None
    return name, struct.unpack_from("<I" if elf.little_endian else ">I", data, at)[0]


MAX_CRC_BYTES = 1 << 30  # a debug file checksummed against a debuglink (only where no build id says)


def crc_matches(path: str, crc: int) -> bool:
    """The file's CRC-32 is crc (read at most MAX_CRC_BYTES: past that it is not taken)."""
    from memdiag.system.safefile import open_regular

    total, seen = 0, 0
    with os.fdopen(open_regular(path), "rb") as f:
        while chunk := f.read(1 << 20):
            seen += len(chunk)
            if seen > MAX_CRC_BYTES:
                return False
            total = zlib.crc32(chunk, total)
    return total == crc
