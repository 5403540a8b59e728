"""Code objects read from a CPython process: function (co_qualname), file (co_filename), first
line, and the line of an instruction from co_linetable, the location table of 3.11+ (the format
of CPython's Objects/locations.md). Each code object is checked to be one (its type is the
process's PyCode_Type) before any field of it is trusted, and read once (cached by address)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .memory import Memory
from .target import PythonProcess

MAX_STR = 4096  # characters of a name or a path read (longer: cut)
MAX_LINETABLE = 1 << 20
CODE_UNIT = 2  # sizeof(_Py_CODEUNIT)
# PyASCIIObject.state's bit fields, the same from 3.11 to 3.13: interned:2, kind:3, compact:1, ascii:1
KIND_SHIFT, KIND_MASK, COMPACT_BIT, ASCII_BIT = 2, 7, 1 << 5, 1 << 6
_ENCODING = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


@dataclass(frozen=True)
class Code:
    qualname: str
    filename: str
    firstlineno: int
    linetable: bytes
    address: int

    def line(self, layout_adaptive: int, instr: int) -> int | None:
        """The line of the instruction at instr (a frame's prev_instr or instr_ptr)."""
        lasti = (instr - (self.address + layout_adaptive)) // CODE_UNIT
        if lasti < 0:  # the frame has not run an instruction yet: it is at its def line
            return self.firstlineno
        return line_at(self.linetable, self.firstlineno, lasti)


def _varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    i += 1
    value, shift = b & 63, 0
    while b & 64:
        b = data[i]
        i += 1
        shift += 6
        value |= (b & 63) << shift
    return value, i


def _svarint(data: bytes, i: int) -> tuple[int, int]:
    v, i = _varint(data, i)
    return (-(v >> 1) if v & 1 else v >> 1), i


def line_at(table: bytes, firstlineno: int, lasti: int) -> int | None:
    """The line of code unit lasti from a 3.11+ location table: entries of (code, length in code
    units), each moving the line by a delta; None where the entry has no location."""
    line, addr, i = firstlineno, 0, 0
    try:
        while i < len(table):
            first = table[i]
            i += 1
            code, length = (first >> 3) & 15, (first & 7) + 1
            here: int | None = line
            if code == 15:  # no location
                here = None
            elif code == 14:  # long form: line delta, end line, column, end column
                delta, i = _svarint(table, i)
                line += delta
                here = line
                for _ in range(3):
                    _, i = _varint(table, i)
            elif code == 13:  # no column
                delta, i = _svarint(table, i)
                line += delta
                here = line
            elif code >= 10:  # one line: delta code - 10, then column and end column bytes
                line += code - 10
                here = line
                i += 2
            else:  # short form: same line, one column byte
                i += 1
            if addr <= lasti < addr + length:
                return here
            addr += length
    except IndexError:
        return None
    return None


class Codes:
    """Code objects of one process, by address."""

    def __init__(self, proc: PythonProcess, memory: Memory):
        self.proc = proc
        self.mem = memory
        self._cache: dict[int, Code | None] = {}
        self.invalid = 0  # addresses that were not a code object (torn frame, freed code)

    def code(self, address: int) -> Code | None:
        if address not in self._cache:
            code = self._read(address)
            self._cache[address] = code
            self.invalid += code is None
        return self._cache[address]

    def _read(self, address: int) -> Code | None:
        lay, mem = self.proc.layout, self.mem
        head = mem.read(address, lay.code_adaptive)
        if head is None or _u64(head, lay.ob_type) != self.proc.types["PyCode_Type"]:
            return None
        qualname = self.string(_u64(head, lay.code_qualname))
        filename = self.string(_u64(head, lay.code_filename))
        table = self.bytes_object(_u64(head, lay.code_linetable))
        if qualname is None or filename is None or table is None:
            return None
        first = struct.unpack_from("<i", head, lay.code_firstlineno)[0]
        return Code(qualname=qualname, filename=filename, firstlineno=first, linetable=table, address=address)

    def string(self, address: int) -> str | None:
        """A compact str object's text (every name and path the compiler makes is compact)."""
        lay, mem = self.proc.layout, self.mem
        head = mem.read(address, lay.str_ascii_size) if address else None
        if head is None or _u64(head, lay.ob_type) != self.proc.types.get("PyUnicode_Type"):
            return None
        length = struct.unpack_from("<q", head, lay.str_length)[0]
        state = struct.unpack_from("<I", head, lay.str_state)[0]
        kind = (state >> KIND_SHIFT) & KIND_MASK
        if not state & COMPACT_BIT or kind not in _ENCODING or length < 0:
            return None
        n = min(length, MAX_STR)
        if n == 0:
            return ""
        if state & ASCII_BIT:
            data = mem.read(address + lay.str_ascii_size, n)
        else:
            data = mem.read(address + lay.str_compact_size, n * kind)
        return data.decode(_ENCODING[kind], errors="replace") if data is not None else None

    def bytes_object(self, address: int) -> bytes | None:
        lay, mem = self.proc.layout, self.mem
        head = mem.read(address, lay.bytes_sval) if address else None
        if head is None or _u64(head, lay.ob_type) != self.proc.types.get("PyBytes_Type"):
            return None
        size = struct.unpack_from("<q", head, lay.ob_size)[0]
        if not 0 <= size <= MAX_LINETABLE:
            return None
        return mem.read(address + lay.bytes_sval, size) if size else b""


def _u64(data: bytes, offset: int) -> int:
    return struct.unpack_from("<Q", data, offset)[0]
