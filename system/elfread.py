"""pyelftools without its eager parts: an ELF file's section map and program headers read from the
headers alone, and a segment's or a section's bytes read no further than its header and the file
allow. pyelftools builds every section the first time one is looked up by name, and every
section again when it builds a dynamic segment; a hash section parses its whole table into Python
lists on the way (at the end of a diagnosis, +7 MiB of memdiag's RSS for the scan's names, measured)."""

from __future__ import annotations

import os
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

# A file's header counts are its own claim: e_shnum is 16 bits, but where it is 0 the count is
# section 0's sh_size, any 64-bit number (a loop over 2^63 headers never ends). Linked modules
# have tens of sections (libc 70, a -ffunction-sections executable's are merged), objects with
# one section per function up to tens of thousands: more than 16 bits' worth is a lie.
MAX_HEADERS = 1 << 16


def _count(n: int, what: str) -> int:
    if not 0 <= n <= MAX_HEADERS:
        raise ELFError(f"claims {n} {what}")
    return n


def section_headers(elf: ELFFile):
    """(index, header, name) of every section, no section built."""
    for i in range(_count(elf.num_sections(), "sections")):
        hdr = elf._get_section_header(i)
        yield i, hdr, elf._get_section_name(hdr)


def segment_headers(elf: ELFFile) -> list:
    """Every program header (p_type, p_vaddr, p_offset, ...), no segment built."""
    return [elf._get_segment_header(i) for i in range(_count(elf.num_segments(), "program headers"))]


def segment_bytes(elf: ELFFile, seg, size: int | None = None) -> bytes:
    """The file's bytes of a segment (its first `size` of them), from its header."""
    elf.stream.seek(seg["p_offset"])
    return elf.stream.read(seg["p_filesz"] if size is None else min(size, seg["p_filesz"]))


def section_bytes(elf: ELFFile, hdr, limit: int, skip: int = 0) -> bytes:
    """A section's bytes as its header places them (from `skip` into it), at most `limit` and never
    past the file's end (a header may claim any size: pyelftools would read, and allocate, it)."""
    if hdr["sh_type"] == "SHT_NOBITS" or skip >= hdr["sh_size"]:
        return b""
    elf.stream.seek(0, os.SEEK_END)
    left = elf.stream.tell() - hdr["sh_offset"] - skip
    if left <= 0:
        return b""
    elf.stream.seek(hdr["sh_offset"] + skip)
    return elf.stream.read(min(hdr["sh_size"] - skip, left, limit))


def open_elf(stream) -> ELFFile:
    """pyelftools' ELFFile with its name-to-section map made from the headers (the map its own first
    get_section_by_name makes by building every section: the same, the last section of a name), and
    its hash sections checked before pyelftools builds one (_checked_section)."""
    elf = ELFFile(stream)
    elf._section_name_map = {name: i for i, _hdr, name in section_headers(elf)}
    elf._make_section = lambda header: _checked_section(elf, header)
    return elf


_HASH_WORDS = "II"  # SHT_HASH: nbucket, nchain
_GNU_HASH_WORDS = "IIII"  # SHT_GNU_HASH: nbuckets, symoffset, bloom_size, bloom_shift


def _checked_section(elf: ELFFile, header):
    """pyelftools builds a hash section by parsing its arrays whole, as long as its counts say
    (32-bit, the file's claim): 2^32 buckets in a sparse file is a list of 4 billion ints. A hash
    section whose arrays do not fit in it (and in the file) is refused. A section is built where its
    name is looked up, or where a symbol table links to it (sh_link)."""
    kind = header["sh_type"]
    if kind in ("SHT_HASH", "SHT_GNU_HASH"):
        stream = elf.stream
        stream.seek(0, os.SEEK_END)
        room = max(0, min(header["sh_size"], stream.tell() - header["sh_offset"]))
        stream.seek(header["sh_offset"])
        layout = _HASH_WORDS if kind == "SHT_HASH" else _GNU_HASH_WORDS
        words = struct.Struct(("<" if elf.little_endian else ">") + layout)
        head = stream.read(words.size)
        if len(head) < words.size:
            raise ELFError(f"{kind} section past the file's end")
        if kind == "SHT_HASH":
            nbucket, nchain = words.unpack(head)
            claim = words.size + 4 * (nbucket + nchain)
        else:
            nbuckets, _symoffset, bloom_size, _shift = words.unpack(head)
            claim = words.size + (elf.elfclass // 8) * bloom_size + 4 * nbuckets
        if claim > room:
            raise ELFError(f"{kind} section claims {claim} bytes in {room}")
    return ELFFile._make_section(elf, header)


class SectionWindow:
    """A section of an open file as a stream of its own (offset 0 is the section's start, reads stop
    at its end, or the file's): what pyelftools reads (.eh_frame's call-frame rules, an uncompressed
    section's DWARF), without the section in memory."""

    def __init__(self, file, start: int, size: int):
        file.seek(0, os.SEEK_END)
        self._file, self._start = file, start
        self.size = max(0, min(size, file.tell() - start))
        self._at = 0

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._at, os.SEEK_END: self.size}[whence]
        self._at = max(0, base + offset)
        return self._at

    def tell(self) -> int:
        return self._at

    def read(self, n: int = -1) -> bytes:
        n = self.size - self._at if n is None or n < 0 else min(n, max(0, self.size - self._at))
        if n <= 0:
            return b""
        self._file.seek(self._start + self._at)
        data = self._file.read(n)
        self._at += len(data)
        return data
