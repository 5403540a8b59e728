"""Byte offsets of kernel struct members, from the running kernel's BTF (/sys/kernel/btf/vmlinux).

bcc compiles against whatever kernel headers are installed (this project's 6.18 test kernel
compiles against 6.1 headers), so a program that follows kernel pointers cannot trust the
headers' struct layouts. The kernel's own BTF describes the layouts it was built with; the few
offsets a program needs are read here and passed to it as -D defines.

The format (Documentation/bpf/btf.rst): a header, then the type records one after another (each
12 bytes plus a kind-dependent tail), then the string section."""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
_STRUCT, _UNION = 4, 5
# bytes after the 12-byte record: fixed per kind, plus per-entry (vlen) for the kinds with lists
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}  # INT, ARRAY, VAR, DECL_TAG
_PER_ENTRY = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # STRUCT, UNION, ENUM, FUNC_PROTO, DATASEC, ENUM64


class Btf:
    """The struct and union types of one BTF blob, their members read on demand. data: the blob
    (bytes, or a buffer such as vmlinux()'s mapping); read in place, nothing of it copied."""

    def __init__(self, data) -> None:
        magic, _, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data, 0)
        if magic != 0xEB9F:
            raise ValueError("not BTF (bad magic)")
        self._data = data
        self._str_at, self._str_end = hdr_len + str_off, hdr_len + str_off + str_len
        self._records: dict[int, int] = {}  # type id -> offset of its record, structs and unions only
        self._named: dict[int, int] = {}  # name's offset in the strings -> the first struct or union of it
        pos, end, type_id = hdr_len + type_off, hdr_len + type_off + type_len, 1
        while pos < end:
            name_off, info = struct.unpack_from("<II", data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind in (_STRUCT, _UNION):
                self._records[type_id] = pos
                if name_off:
                    self._named.setdefault(name_off, type_id)
            pos += 12 + _FIXED.get(kind, 0) + _PER_ENTRY.get(kind, 0) * vlen
            type_id += 1

    def _name(self, off: int) -> str:
        at = self._str_at + off
        return bytes(self._data[at : self._data.find(b"\0", at, self._str_end)]).decode()

    def _type_named(self, name: str) -> int | None:
        """The first struct or union of that name: its name's offsets in the strings (deduplicated
        by the kernel's build, so one, but every one is tried), each looked up among the types."""
        want = b"\0" + name.encode() + b"\0"
        at = self._data.find(want, self._str_at, self._str_end)
        found = []
        while at >= 0:
            if (off := at + 1 - self._str_at) in self._named:
                found.append(self._named[off])
            at = self._data.find(want, at + 1, self._str_end)
        return min(found) if found else None

    def _members(self, type_id: int):
        pos = self._records[type_id]
        _, info, size = struct.unpack_from("<III", self._data, pos)
        kflag = info >> 31
        for i in range(info & 0xFFFF):
            name_off, member_type, offset = struct.unpack_from("<III", self._data, pos + 12 + 12 * i)
            bits = offset & 0xFFFFFF if kflag else offset
            yield (self._name(name_off) if name_off else ""), member_type, bits

    def size(self, struct_name: str) -> int | None:
        type_id = self._type_named(struct_name)
        return None if type_id is None else struct.unpack_from("<I", self._data, self._records[type_id] + 8)[0]

    def offset(self, struct_name: str, member: str) -> int | None:
        """Byte offset of struct_name.member (members of anonymous structs and unions included);
        None when this kernel's struct has no such member."""
        type_id = self._type_named(struct_name)
        return None if type_id is None else self._find(type_id, member)

    def _find(self, type_id: int, member: str) -> int | None:
        for name, member_type, bits in self._members(type_id):
            if name == member:
                return bits // 8
            if not name and member_type in self._records:  # an anonymous struct or union
                inner = self._find(member_type, member)
                if inner is not None:
                    return bits // 8 + inner
        return None


def vmlinux() -> Btf | None:
    """The running kernel's BTF (None: the kernel has none, or it cannot be read). Read into an
    anonymous mapping of its own, unmapped with the Btf: parsed anew at each call and not kept (the
    blob is ~5 MiB, and read as bytes it stayed in memdiag's heap for the whole diagnosis, ~8 MiB of
    RSS with the names decoded, measured): callers keep what they read."""
    try:
        with VMLINUX.open("rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size  # sysfs gives the blob's size
            buf = mmap.mmap(-1, max(size, 1))
            view, got = memoryview(buf), 0
            while got < size and (n := f.readinto(view[got:])):  # sysfs hands it out a chunk at a time
                got += n
            view.release()
        return Btf(buf)
    except (OSError, ValueError, struct.error):
        return None
