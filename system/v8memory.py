"""A Node.js process's memory split as V8 lays it out, from /proc/PID/smaps alone (no inspector, no
signal, nothing asked of the process): V8's heap against what lives outside it.

V8 maps its heap in pages of its own (256 KiB, large objects alone) at addresses it chooses at
random below 64 TiB (v8::base::OS::GetRandomMmapAddr on x86-64 masks its hints to 0x3fffffff000),
where nothing else in the process asks to be: glibc's heap and arenas, large malloc blocks, thread
stacks and libraries sit where the kernel places mappings without a hint, near the top of the
address space, or at the executable's break (`[heap]`). So:

- v8: anonymous mappings below 64 TiB. Their mapped size is the heap V8 committed (what
  process.memoryUsage().heapTotal says, within a few percent); their resident size what it touched.
- native: `[heap]` and anonymous read-write mappings elsewhere: malloc'd memory, among it the
  contents of array buffers and Buffers (V8's external memory, malloc'd by Node's array-buffer
  allocator), Node's and addons' C++ objects, thread stacks.
- jit: anonymous executable mappings elsewhere (V8's code range).
Files mapped (the binary, libraries) are not counted."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from ._parse import Fact, kib_to_bytes, lines_of, parse_file, read_text
from .runtime import maps_node

V8_ADDRESS_LIMIT = 0x3FFFFFFFF000 + 0x1000  # V8's random mmap hints stay below this on x86-64
_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \d+\s*(.*)$")


class V8Memory(Fact):
    v8_mapped: int  # bytes V8 mapped read-write for its heap (committed)
    v8_resident: int  # of it resident
    native_resident: int  # [heap] and other anonymous read-write memory, resident
    jit_resident: int  # V8's generated code, resident
    v8_mappings: int  # how many mappings the heap is in


def _mappings(text: str | Iterable[str]):
    """(start, end, perms, path, v8, rss) of each mapping in /proc/PID/maps or smaps: rss from the
    Rss line smaps gives it (bytes; 0 from maps); v8: anonymous, below V8's hint limit and not a
    file's .bss continued past its last page (as the non-PIE node binary's is: 176 KiB of node 20's
    statics, which V8's heap never is)."""
    file_end = -1  # where the last file mapping ends: an anonymous mapping from there is its .bss
    mapping: list | None = None
    for line in lines_of(text):
        m = _HEADER.match(line)
        if m is None:
            if mapping is not None and line.startswith("Rss:"):
                mapping[5] = kib_to_bytes(line[len("Rss:") :]) or 0
            continue
        if mapping is not None:
            yield tuple(mapping)
        start, end, perms, named = int(m[1], 16), int(m[2], 16), m[3], m[4].strip()
        path = "" if named.startswith("[anon:") else named  # a named anonymous mapping is still anonymous
        if path and not path.startswith("["):
            file_end, v8 = end, False
        else:
            bss, file_end = start == file_end, -1
            v8 = not path and start < V8_ADDRESS_LIMIT and not bss
        mapping = [start, end, perms, path, v8, 0]
    if mapping is not None:
        yield tuple(mapping)


def parse_smaps(text: str | Iterable[str]) -> V8Memory:
    mapped = resident = native = jit = count = 0
    for start, end, perms, path, v8, rss in _mappings(text):
        if path and path != "[heap]":
            continue  # files, [stack], [vdso]...: not the heap's or malloc's
        if v8:
            count += 1
            resident += rss
            mapped += end - start if "w" in perms else 0
        elif path == "[heap]" or ("w" in perms and "x" not in perms):
            native += rss  # the break's heap, malloc's other memory, the binary's .bss
        elif "x" in perms:
            jit += rss
    return V8Memory(v8_mapped=mapped, v8_resident=resident, native_resident=native, jit_resident=jit, v8_mappings=count)


def read_v8_memory(pid: int, proc_root: Path = Path("/proc")) -> V8Memory | None:
    """The split of a Node process's memory now, or None (gone, or smaps unreadable)."""
    return parse_file(proc_root / str(pid) / "smaps", parse_smaps)  # line by line: ~1 KiB a mapping


def parse_v8_heap_ranges(maps: str) -> tuple[tuple[int, int], ...]:
    """[start, end) of every writable mapping V8's heap is in (as parse_smaps counts it), from
    /proc/PID/maps."""
    return tuple((start, end) for start, end, perms, _, v8, _ in _mappings(maps) if v8 and "w" in perms)


def read_v8_heap_ranges(pid: int, proc_root: Path = Path("/proc")) -> tuple[tuple[int, int], ...] | None:
    """Where V8's heap is in a Node process now (one read of its maps), or None (gone, or no Node)."""
    text = read_text(proc_root / str(pid) / "maps")
    if text is None or not maps_node(text):
        return None
    return parse_v8_heap_ranges(text)
