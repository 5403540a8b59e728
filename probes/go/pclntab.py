"""A Go executable's own function table (the pclntab the runtime uses for tracebacks), read from
the file: function names and entries, file:line of a PC, and the inline tree, so a function the
compiler inlined into its caller is still named, as runtime.CallersFrames and pprof name it. The
table survives `strip` and `-ldflags=-s -w` (the runtime needs it), so stripped binaries, the
distribution's norm, are named too.

Layout (Go 1.18 to 1.19, magic 0xfffffff0; runtime/symtab.go, cmd/link/internal/ld/pcln.go): a
header (pcHeader) with the offsets of the name, compilation-unit, file, pc-value and function
tables; the function table's (entry offset, _func offset) pairs sorted by entry; each _func with
its pc-value tables (file, line, pcdata) and funcdata offsets from moduledata.gofunc, the third of
which (FUNCDATA_InlTree) is the inline tree. moduledata, which holds gofunc and the data and bss
ranges, is found as the runtime's own record that points at the header."""

from __future__ import annotations

import array
import bisect
import functools
import mmap
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection
from memdiag.system.elfread import open_elf, segment_headers
from memdiag.system.safefile import open_regular

from ..symtab import MAX_SYMBOLS, STT_OBJECT, symbol_rows

MAGIC_118 = 0xFFFFFFF0  # Go 1.18 and 1.19 (1.20 moved to 0xfffffff1 with another _func and inline tree)
_FUNC = struct.Struct("<IiiIIIIIIBBBB")  # runtime._func up to nfuncdata: 40 bytes
_INLINED = struct.Struct("<hBBiiii")  # runtime.inlinedCall: parent, funcID, pad, file, line, func_, parentPc
PCDATA_INLTREE = 2
FUNCDATA_INLTREE = 3
# moduledata (runtime/symtab.go, 64-bit): pcHeader, then six slices of 24 bytes (funcnametab .. ftab),
# findfunctab, minpc, maxpc, text, etext, noptrdata, enoptrdata, data, edata, bss, ebss, noptrbss,
# enoptrbss, end, gcdata, gcbss, types, etypes, rodata, gofunc
_MD_WORDS = 1 + 6 * 3 + 20
_MD_FIELDS = ("text", "etext", "noptrdata", "enoptrdata", "data", "edata", "bss", "ebss", "noptrbss", "enoptrbss")


# the function count is the file's claim, and each costs 8 bytes of memdiag's and a read: large Go
# programs have ~100,000 functions (kubelet 80,000), 10x that is a lie (or nothing worth reading)
MAX_FUNCS = 1_000_000


class PclntabError(Exception):
    """Not a Go executable this reader understands; the message says why in one line."""


@dataclass(frozen=True)
class GoFrame:
    function: str
    file: str | None
    line: int | None
    inlined: bool = False  # compiled into its caller: named from the inline tree

    def label(self) -> str:
        where = f" ({self.file.rsplit('/', 1)[-1]}:{self.line})" if self.file and self.line else ""
        return f"{self.function}{where}"


@dataclass(frozen=True)
class ModuleData:
    """The runtime's record of this module: its address and the ranges the data symbols sit in."""

    address: int
    gofunc: int
    ranges: dict[str, int]

    def holds_data(self, addr: int) -> bool:
        """Whether addr is a variable of the module (its data, noptrdata, bss or noptrbss)."""
        r = self.ranges
        return any(
            r[a] <= addr < r[b]
            for a, b in (("noptrdata", "enoptrdata"), ("data", "edata"), ("bss", "ebss"), ("noptrbss", "enoptrbss"))
        )


class GoTable:
    """The function table of one Go executable (addresses as the file links them: add the load
    bias for a PIE)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with os.fdopen(open_regular(path), "rb") as f:  # never blocking on a FIFO, a regular file only
                self._map = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
                elf = open_elf(f)
                self._loads = [
                    (s["p_vaddr"], s["p_offset"], s["p_filesz"])
                    for s in segment_headers(elf)
                    if s["p_type"] == "PT_LOAD"
                ]
                section = elf.get_section_by_name(".gopclntab")
                self.pie = elf.header["e_type"] == "ET_DYN"
                self.symtab = _data_symbols(elf)
        except Exception as e:  # noqa: BLE001  (a corrupt or hostile file raises anything: no Go table)
            raise PclntabError(f"{path}: {type(e).__name__}: {e}") from None
        self.header = section["sh_addr"] if section is not None else self._find_header()
        self._parse_header()
        self.moduledata = self._find_moduledata()
        # one machine word each, not a Python int (a large program has ~100k functions)
        self._entries = array.array(
            "Q", (self._u32(self._ftab + 8 * i) + self.text_start for i in range(self.nfunc + 1))
        )

    # --- the file ---------------------------------------------------------------------------
    def read(self, vaddr: int, size: int) -> bytes | None:
        for base, offset, filesz in self._loads:
            if base <= vaddr and vaddr + size <= base + filesz:
                return self._map[offset + vaddr - base : offset + vaddr - base + size]
        return None

    def _u32(self, vaddr: int) -> int:
        raw = self.read(vaddr, 4)
        if raw is None:
            raise PclntabError(f"{self.path}: pclntab address {vaddr:#x} outside the file")
        return struct.unpack("<I", raw)[0]

    def _cstring(self, vaddr: int) -> str:
        for base, offset, filesz in self._loads:
            if base <= vaddr < base + filesz:
                start = offset + vaddr - base
                end = self._map.find(b"\0", start, offset + filesz)
                return self._map[start : end if end >= 0 else start].decode(errors="replace")
        return "?"

    def _find_header(self) -> int:
        """Without section headers: the header's magic, at an 8-byte boundary in a read-only segment."""
        needle = struct.pack("<IBBBB", MAGIC_118, 0, 0, 1, 8)
        for base, offset, filesz in self._loads:
            at = self._map.find(needle, offset, offset + filesz)
            while at >= 0 and (at - offset) % 8:
                at = self._map.find(needle, at + 1, offset + filesz)
            if at >= 0:
                return base + at - offset
        raise PclntabError(f"{self.path}: no Go 1.18-1.19 pclntab (not a Go executable, or another Go version)")

    def _parse_header(self) -> None:
        raw = self.read(self.header, 8 + 8 * 8)
        if raw is None:
            raise PclntabError(f"{self.path}: pclntab header outside the file")
        magic, _p1, _p2, min_lc, ptr_size = struct.unpack_from("<IBBBB", raw)
        if magic != MAGIC_118 or ptr_size != 8 or min_lc != 1:
            raise PclntabError(f"{self.path}: pclntab magic {magic:#x} (only Go 1.18-1.19 on amd64 is read)")
        nfunc, _nfiles, text, name, cu, files, pc, func = struct.unpack_from("<8Q", raw, 8)
        if nfunc > MAX_FUNCS:
            raise PclntabError(f"{self.path}: pclntab claims {nfunc} functions (more than {MAX_FUNCS:,})")
        self.nfunc, self.text_start = nfunc, text
        self._names, self._cutab, self._files = self.header + name, self.header + cu, self.header + files
        self._pctab, self._ftab = self.header + pc, self.header + func

    def _find_moduledata(self) -> ModuleData:
        """runtime.firstmoduledata: the record whose first word is the header's address and whose
        name table is the header's (a check no other word pair passes by chance)."""
        want = struct.pack("<QQ", self.header, self._names)
        for base, offset, filesz in self._loads:
            at = self._map.find(want, offset, offset + filesz)
            while at >= 0:
                if (at - offset) % 8 == 0:
                    words = struct.unpack_from(f"<{_MD_WORDS}Q", self._map, at)
                    named = dict(zip(_MD_FIELDS, words[22:32], strict=True))
                    return ModuleData(address=base + at - offset, gofunc=words[_MD_WORDS - 1], ranges=named)
                at = self._map.find(want, at + 1, offset + filesz)
        if self.pie:
            raise PclntabError(f"{self.path}: a position-independent Go executable (its moduledata is relocated)")
        raise PclntabError(f"{self.path}: no runtime.firstmoduledata found")

    # --- functions ----------------------------------------------------------------------------
    def function_index(self, pc: int) -> int | None:
        """The index of the function whose code holds pc (file address), or None."""
        i = bisect.bisect_right(self._entries, pc) - 1
        return i if 0 <= i < self.nfunc else None

    @functools.lru_cache(maxsize=65536)  # noqa: B019 (one table per file, kept for the process's life)
    def _func(self, i: int) -> tuple[int, tuple, list[int], list[int]]:
        """(entry, _func fields, pcdata offsets, funcdata offsets) of function i."""
        base = self._ftab + self._u32(self._ftab + 8 * i + 4)
        raw = self.read(base, _FUNC.size)
        if raw is None:
            raise PclntabError(f"{self.path}: _func at {base:#x} outside the file")
        fields = _FUNC.unpack(raw)
        npcdata, nfuncdata = fields[7], fields[12]
        tables = self.read(base + _FUNC.size, 4 * (npcdata + nfuncdata)) or b""
        offsets = list(struct.unpack(f"<{npcdata + nfuncdata}I", tables))
        return self.text_start + fields[0], fields, offsets[:npcdata], offsets[npcdata:]

    def name_at(self, nameoff: int) -> str:
        return self._cstring(self._names + nameoff)

    def function_name(self, i: int) -> str:
        return self.name_at(self._func(i)[1][1])

    def entries_of(self, names: Iterable[str]) -> dict[str, int]:
        """The entry address of each function named that the table has (the first function of a
        name: a few runtime names repeat). One pass over the functions' name offsets, matched
        against where the names lie in the name table: no name of the others is read or kept (a
        dict of every name, read through the cached _func records, kept one record per function of
        a large program: prometheus's tens of thousands)."""
        start, end = self._file_offset(self._names), self._file_offset(self._cutab)
        wanted: dict[int, str] = {}  # offsets in the name table -> the name there
        for name in names:
            needle = name.encode() + b"\0"
            at = self._map.find(needle, start, end)
            while at >= 0:
                if at == start or self._map[at - 1] == 0:  # a whole name, not another's tail
                    wanted[at - start] = name
                at = self._map.find(needle, at + 1, end)
        out: dict[str, int] = {}
        if not wanted:
            return out
        ftab = self._file_offset(self._ftab)
        for i in range(self.nfunc):
            func = self._ftab + struct.unpack_from("<I", self._map, ftab + 8 * i + 4)[0]
            nameoff = struct.unpack_from("<i", self._map, self._file_offset(func) + 4)[0]  # _func.nameOff
            name = wanted.get(nameoff)
            if name is not None and name not in out:
                out[name] = self._entries[i]
        return out

    def _file_offset(self, vaddr: int) -> int:
        for base, offset, filesz in self._loads:
            if base <= vaddr < base + filesz:
                return offset + vaddr - base
        raise PclntabError(f"{self.path}: pclntab address {vaddr:#x} outside the file")

    def function_end(self, entry: int) -> int:
        i = self.function_index(entry)
        return self._entries[i + 1] if i is not None else entry

    # --- pc-value tables ------------------------------------------------------------------------
    def pcvalue(self, entry: int, table: int, pc: int) -> int:
        """The value a pc-value table (runtime.pcvalue) gives pc; -1 when it gives none."""
        if table == 0:
            return -1
        at, val, cur, first = self._pctab + table, -1, entry, True
        while True:
            delta, at = self._varint(at)
            if delta == 0 and not first:
                return -1
            first = False
            val += -(delta & 1) ^ (delta >> 1)
            step, at = self._varint(at)
            cur += step  # PCQuantum is 1 on amd64
            if pc < cur:
                return val

    def _varint(self, at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            raw = self.read(at, 1)
            if raw is None:
                raise PclntabError(f"{self.path}: pc-value table runs past the file")
            b, at = raw[0], at + 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value, at
            shift += 7

    def _file_name(self, fields: tuple, fileno: int) -> str | None:
        if fileno < 0:
            return None
        off = self._u32(self._cutab + 4 * (fields[8] + fileno))
        return None if off == 0xFFFFFFFF else self._cstring(self._files + off)

    def _max_value(self, entry: int, table: int) -> int:
        """The largest value a pc-value table takes over its function (an inline tree's last index)."""
        if table == 0:
            return -1
        at, val, top, first = self._pctab + table, -1, -1, True
        while True:
            delta, at = self._varint(at)
            if delta == 0 and not first:
                return top
            first = False
            val += -(delta & 1) ^ (delta >> 1)
            top = max(top, val)
            _step, at = self._varint(at)

    def _inlined(self, funcdata: list[int], ix: int) -> tuple | None:
        if len(funcdata) <= FUNCDATA_INLTREE or funcdata[FUNCDATA_INLTREE] == 0xFFFFFFFF:
            return None
        raw = self.read(self.moduledata.gofunc + funcdata[FUNCDATA_INLTREE] + _INLINED.size * ix, _INLINED.size)
        return _INLINED.unpack(raw) if raw else None

    # --- frames ---------------------------------------------------------------------------------
    def frame(self, tracepc: int) -> GoFrame | None:
        """The innermost frame at tracepc (a return address minus one): the inlined function when
        the compiler put one there, as runtime.CallersFrames names each PC of a Go traceback."""
        frames = self.frames(tracepc, expand=False)
        return frames[0] if frames else None

    def frames(self, tracepc: int, expand: bool = True) -> list[GoFrame]:
        """The frames at tracepc, innermost first: the inlined calls the inline tree records there,
        then the real function (runtime_expandFinalInlineFrame's walk). A native stack (a BPF
        probe's) holds one address per real frame, so it wants them all."""
        i = self.function_index(tracepc)
        if i is None:
            return []
        entry, fields, pcdata, funcdata = self._func(i)
        out: list[GoFrame] = []
        for _depth in range(64):  # the compiler's inlining depth is far below this
            ix = self.pcvalue(entry, pcdata[PCDATA_INLTREE], tracepc) if len(pcdata) > PCDATA_INLTREE else -1
            call = self._inlined(funcdata, ix) if ix >= 0 else None
            if call is None:
                break
            out.append(self._at(entry, fields, tracepc, self.name_at(call[5]), inlined=True))
            if not expand:
                return out
            tracepc = entry + call[6]
        out.append(self._at(entry, fields, tracepc, self.name_at(fields[1])))
        return out

    def called_from(self, pc: int) -> GoFrame | None:
        """The function a traceback PC called: the frame Go's heap profile drops when the compiler
        calls runtime.mallocgc straight from the program's code (make and copy fused, for one):
        mProf_Malloc skips four frames, counting on a runtime helper (makeslice, newobject) between
        mallocgc and the program. pc is a return address, or an inline mark plus one where the
        traceback stepped out of an inlined call: then the callee is the inlined call made there.
        None when neither can be read (an indirect call)."""
        i = self.function_index(pc - 1)
        if i is None:
            return None
        entry, fields, pcdata, funcdata = self._func(i)
        if len(pcdata) > PCDATA_INLTREE:
            for ix in range(self._max_value(entry, pcdata[PCDATA_INLTREE]) + 1):
                call = self._inlined(funcdata, ix)
                if call is not None and entry + call[6] == pc - 1:
                    return GoFrame(function=self.name_at(call[5]), file=None, line=None, inlined=True)
        raw = self.read(pc - 5, 5)
        if raw is None or raw[0] != 0xE8:  # CALL rel32
            return None
        target = pc + struct.unpack("<i", raw[1:])[0]
        callee = self.function_index(target)
        if callee is None or self._entries[callee] != target:
            return None
        return GoFrame(function=self.function_name(callee), file=None, line=None)

    def _at(self, entry: int, fields: tuple, pc: int, name: str, inlined: bool = False) -> GoFrame:
        line = self.pcvalue(entry, fields[6], pc)
        file = self._file_name(fields, self.pcvalue(entry, fields[5], pc))
        return GoFrame(function=name, file=file, line=line if line > 0 else None, inlined=inlined)


def _data_symbols(elf: ELFFile) -> dict[str, int]:
    """Object symbols by name from .symtab, when the binary kept it (not stripped)."""
    sec = elf.get_section_by_name(".symtab")
    if not isinstance(sec, SymbolTableSection):
        return {}
    out: dict[str, int] = {}
    # the bulk reader, bounded (a Go binary's .symtab: ~100,000 rows; pyelftools' 30 us a row each)
    for name, value, _size, kind, _bind, _shndx in symbol_rows(elf, sec):
        if kind == STT_OBJECT and name:
            out[name] = value
            if len(out) >= MAX_SYMBOLS:
                break
    return out


def go_table(path: str) -> GoTable:
    """The table of a file (/proc/PID/exe works, a container's too), parsed once per file: the
    same binary run by many processes is one table (raises PclntabError)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise PclntabError(f"{path}: {e.strerror}") from None
    return _table(st.st_dev, st.st_ino, st.st_mtime_ns, path)


@functools.lru_cache(maxsize=16)
def _table(_dev: int, _ino: int, _mtime: int, path: str) -> GoTable:
    return GoTable(path)
