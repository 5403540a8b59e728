"""Small ELF files made byte by byte, for the symbol reader's bounds and its fuzz: a shared object
with one loadable segment, a .text section and a .symtab of as many function symbols as asked
(no compiler or assembler: 2 million symbols are written in seconds)."""

from __future__ import annotations

import struct

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
TEXT_AT = 0x1000  # .text's address and file offset
FUNC_BYTES = 16  # each generated function's size


def debug_at(end: int) -> int:
    """Where a generated file's .debug_info starts, for a file of `end` bytes: the next 1 MiB."""
    return (end + (1 << 20)) & ~((1 << 20) - 1)


def shared_object(symbols: int, name_width: int = 12, shared_name: int = 0, debug_info: int = 0) -> bytes:
    """An ELF64 x86-64 ET_DYN whose .symtab holds `symbols` global functions f000000000001, ... each
    FUNC_BYTES long in .text, one after the other; shared_name > 0: every one named by the same
    string of that many characters (no NUL after it); debug_info > 0: a .debug_info section of that
    many bytes after the file's end (at DEBUG_AT(file): truncate the file up to it, sparse)."""
    text_size = max(symbols, 1) * FUNC_BYTES
    names = bytearray(b"\0")
    syms = bytearray(_SYM.size)  # the null symbol
    if shared_name:
        names += b"g" * shared_name
    for i in range(symbols):
        at = len(names)
        if shared_name:
            at = 1
        else:
            names += b"f%0*d\0" % (name_width, i + 1)
        syms += _SYM.pack(at, 0x12, 0, 1, TEXT_AT + i * FUNC_BYTES, FUNC_BYTES)  # GLOBAL FUNC in section 1
    shstr = b"\0.text\0.symtab\0.strtab\0.shstrtab\0.debug_info\0"
    symtab_at = TEXT_AT + text_size
    strtab_at = symtab_at + len(syms)
    shstr_at = strtab_at + len(names)
    shoff = (shstr_at + len(shstr) + 7) & ~7
    sections = [
        _SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        _SHDR.pack(1, 1, 0x6, TEXT_AT, TEXT_AT, text_size, 0, 0, 16, 0),  # .text PROGBITS ALLOC|EXEC
        _SHDR.pack(7, 2, 0, 0, symtab_at, len(syms), 3, 1, 8, _SYM.size),  # .symtab -> .strtab
        _SHDR.pack(15, 3, 0, 0, strtab_at, len(names), 0, 0, 1, 0),  # .strtab
        _SHDR.pack(23, 3, 0, 0, shstr_at, len(shstr), 0, 0, 1, 0),  # .shstrtab
    ]
    if debug_info:
        sections.append(_SHDR.pack(33, 1, 0, 0, debug_at(shoff + 6 * 64), debug_info, 0, 0, 1, 0))
    ident = b"\x7fELF\x02\x01\x01" + bytes(9)
    ehdr = _EHDR.pack(ident, 3, 62, 1, 0, 64, shoff, 0, 64, 56, 1, 64, len(sections), 4)
    phdr = _PHDR.pack(1, 5, 0, 0, 0, shoff, shoff, 0x1000)  # PT_LOAD R+X of the whole file
    out = bytearray(ehdr + phdr)
    out += bytes(TEXT_AT - len(out))
    out += b"\xc3" * text_size  # ret
    out += syms + names + shstr
    out += bytes(shoff - len(out))
    for s in sections:
        out += s
    return bytes(out)
