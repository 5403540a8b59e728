"""A held block named in Python's terms: the reachability scan (probes/reach.py) finds the word
that points at a growing block; when that word lies in a Python object, or in the item array of a
module global's list, the holder is the global: "`__main__.failed` (a list)".

The object around a word is found from pymalloc's pool header (objects of 512 bytes or less sit
in 16 KiB pools of one size class) and checked: its type pointer must point at a type (a type's
own type is `type`, or a metaclass whose type is). The globals come from sys.modules: every
module's dict, and the items of each global list, tuple, set or dict, indexed once per scan
within a bound of bytes read (Memory.max_bytes). A word that is in none of them is not named."""

from __future__ import annotations

import bisect
import struct
from collections import Counter
from dataclasses import dataclass

from .code import Codes
from .layout import (
    DICT_KEYS_GENERAL,
    POOL_MAXNEXT,
    POOL_OVERHEAD,
    POOL_SIZE,
    POOL_SZIDX,
    SMALL_ALIGNMENT,
    SMALL_MAX,
    TPFLAGS_DICT_SUBCLASS,
    TPFLAGS_HAVE_GC,
    TPFLAGS_LIST_SUBCLASS,
    TPFLAGS_TUPLE_SUBCLASS,
)
from .memory import Memory
from .target import PythonProcess

MAX_ITEMS = 1 << 20  # items of one container read (8 MiB of pointers)
MAX_TP_NAME = 128
_ARTICLE = {"list": "a list", "tuple": "a tuple", "dict": "a dict", "set": "a set"}


@dataclass(frozen=True)
class _Global:
    name: str  # module.attribute
    kind: str  # its type's name


class Holders:
    """Module globals of one CPython process, and the objects and item arrays they hold."""

    def __init__(self, proc: PythonProcess, memory: Memory):
        self.proc, self.mem, self.lay = proc, memory, proc.layout
        self.codes = Codes(proc, memory)
        self._types: dict[int, tuple[str, int] | None] = {}
        self._by_address: dict[int, _Global] = {}  # a global's object
        self._items: dict[int, _Global] = {}  # an object a global container holds
        self._arrays: list[tuple[int, int, _Global]] = []  # a global list's or tuple's item array
        self._sorted: list[int] | None = None  # the held objects' addresses, in order
        self._indexed = False

    # --- naming ---------------------------------------------------------------------------
    def name(self, word: int, block: int, size: int = 0) -> str | None:
        """What holds the block at `block` through the pointer at address `word`, or None. A block
        that holds small objects (a pymalloc arena, whose own pool lists point at it) is held by
        the global whose container holds most of the objects inside it."""
        self._index()
        for lo, hi, g in self._arrays:
            if lo <= word < hi:
                return _said(g)
        for address in (self.object_at(word), self.object_start(block)):
            if address is None:
                continue
            g = self._by_address.get(address) or self._items.get(address)
            if g is not None:
                return _said(g)
        inside = self._held_inside(block, block + size) if size else None
        return _said(inside) if inside is not None else None

    def _held_inside(self, lo: int, hi: int) -> _Global | None:
        """The global holding the most of the objects that lie in [lo, hi)."""
        if self._sorted is None:
            self._sorted = sorted(self._items)
        first, last = bisect.bisect_left(self._sorted, lo), bisect.bisect_left(self._sorted, hi)
        counts = Counter(self._items[a] for a in self._sorted[first:last])
        return counts.most_common(1)[0][0] if counts else None

    def object_at(self, address: int) -> int | None:
        """The small object (pymalloc block) whose memory holds address, checked by its type."""
        pool = address & ~(POOL_SIZE - 1)
        head = self.mem.read(pool, POOL_OVERHEAD)
        if head is None:
            return None
        szidx, maxnext = struct.unpack_from("<I", head, POOL_SZIDX)[0], struct.unpack_from("<I", head, POOL_MAXNEXT)[0]
        size = (szidx + 1) * SMALL_ALIGNMENT
        if size > SMALL_MAX or maxnext != POOL_SIZE - size or address < pool + POOL_OVERHEAD:
            return None  # not a pool in use
        block = pool + POOL_OVERHEAD + (address - pool - POOL_OVERHEAD) // size * size
        return self.object_start(block)

    def object_start(self, block: int) -> int | None:
        """The object in a block: at its start, or after the PyGC_Head of a GC-tracked type."""
        for address, gc in ((block, False), (block + self.lay.gc_head, True)):
            t = self.type_of(address)
            if t is not None and bool(t[1] & TPFLAGS_HAVE_GC) == gc:
                return address
        return None

    def type_of(self, obj: int) -> tuple[str, int] | None:
        """(tp_name, tp_flags) of the object at obj, if its type pointer points at a type."""
        tp = self.mem.u64(obj + self.lay.ob_type)
        if not tp:
            return None
        if tp not in self._types:
            self._types[tp] = self._type(tp)
        return self._types[tp]

    def _type(self, tp: int) -> tuple[str, int] | None:
        meta = self.mem.u64(tp + self.lay.ob_type)
        type_type = self.proc.types.get("PyType_Type")
        if not meta or (meta != type_type and self.mem.u64(meta + self.lay.ob_type) != type_type):
            return None
        flags = self.mem.u64(tp + self.lay.tp_flags)
        name_at = self.mem.u64(tp + self.lay.tp_name)
        raw = self.mem.read(name_at, MAX_TP_NAME) if name_at else None
        if flags is None or raw is None:
            return None
        return raw.split(b"\0", 1)[0].decode(errors="replace"), flags

    # --- the globals ------------------------------------------------------------------------
    def _index(self) -> None:
        if self._indexed:
            return
        self._indexed = True
        lay, mem = self.lay, self.mem
        interp = mem.u64(self.proc.interpreters_head)
        modules = mem.u64(interp + lay.interp_modules) if interp else None
        for key, module in self.dict_items(modules or 0):
            modname = self.codes.string(key)
            if modname is None or mem.u64(module + lay.ob_type) != self.proc.types.get("PyModule_Type"):
                continue
            for k, value in self.dict_items(mem.u64(module + lay.module_dict) or 0):
                attr = self.codes.string(k)
                if attr is None or (attr.startswith("__") and attr.endswith("__")):
                    continue  # __builtins__, __loader__, ...: the interpreter's, not the program's
                self._add(f"{modname}.{attr}", value)

    def _add(self, name: str, value: int) -> None:
        t = self.type_of(value)
        if t is None:
            return
        g = _Global(name, t[0])
        self._by_address.setdefault(value, g)
        for item in self.items(value, t, g):
            self._items.setdefault(item, g)

    def items(self, obj: int, t: tuple[str, int], g: _Global) -> list[int]:
        """The objects a list, tuple, dict (values) or set holds; a list's or tuple's item array
        is kept as a range, so a word inside it names the container."""
        lay, mem, types = self.lay, self.mem, self.proc.types
        tp = mem.u64(obj + lay.ob_type)
        flags = t[1]
        if flags & (TPFLAGS_LIST_SUBCLASS | TPFLAGS_TUPLE_SUBCLASS):
            n = mem.i64(obj + lay.ob_size) or 0
            # a list's items are an array of their own; a tuple's follow its header
            array = (mem.u64(obj + lay.list_items) or 0) if flags & TPFLAGS_LIST_SUBCLASS else obj + lay.tuple_items
            if not 0 < n <= MAX_ITEMS or not array:
                return []
            self._arrays.append((array, array + 8 * n, g))
            return [w for w in mem.words(array, n) or [] if w]
        if flags & TPFLAGS_DICT_SUBCLASS:
            return [v for _k, v in self.dict_items(obj)]
        if tp == types.get("PySet_Type"):
            mask = mem.i64(obj + lay.set_mask) or 0
            table = mem.u64(obj + lay.set_table) or 0
            if not 0 <= mask < MAX_ITEMS or not table:
                return []
            words = mem.words(table, 2 * (mask + 1)) or []
            return [w for w in words[0::2] if w]
        return []

    def dict_items(self, d: int) -> list[tuple[int, int]]:
        """(key, value) pairs of a dict with a combined table (module dicts are; a split table,
        an instance's, yields nothing)."""
        lay, mem = self.lay, self.mem
        if not d:
            return []
        keys, values = mem.u64(d + lay.dict_keys), mem.u64(d + lay.dict_values)
        head = mem.read(keys, lay.keys_indices) if keys and not values else None
        if head is None:
            return []
        index_bytes, kind = 1 << head[lay.keys_log2_index_bytes], head[lay.keys_kind]
        n = struct.unpack_from("<q", head, lay.keys_nentries)[0]
        width = 3 if kind == DICT_KEYS_GENERAL else 2  # words per entry: (hash,) key, value
        if not 0 < n <= MAX_ITEMS or index_bytes > 8 * MAX_ITEMS:
            return []
        words = mem.words(keys + lay.keys_indices + index_bytes, n * width) or []
        pairs = zip(words[width - 2 :: width], words[width - 1 :: width], strict=True)
        return [(k, v) for k, v in pairs if k and v]


def _said(g: _Global) -> str:
    article = _ARTICLE.get(g.kind) or ("an " if g.kind[:1].lower() in "aeiou" else "a ") + g.kind
    return f"`{g.name}` ({article})"
