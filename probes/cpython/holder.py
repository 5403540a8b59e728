"""A held block named in Python's terms: the reachability scan (probes/reach.py) finds the word
that points at a growing block; when that word lies in a Python object, or in the item array of a
module global's list, the holder is the global: "`__main__.failed` (a list)".

The object around a word is found from pymalloc's pool header (objects of 512 bytes or less sit
in 16 KiB pools of one size class) and checked: its type pointer must point at a type (a type's
own type is `type`, or a metaclass whose type is). The globals come from sys.modules: every
module's dict, the items of each global list, tuple, set or dict and those of the containers
among them (a dict of dicts: a cache's entries), and the containers a module's own classes hold
as class attributes (`orders.Orders.failed`). Then the globals of the frames the BPF walk
recorded that no module holds: a file exec() ran in a dict of its own, as `twistd -y` runs a .tac
("`failed` (a list, a global of leakyweb.tac run by exec())"). Indexed once per scan within a
bound of time and bytes read (INDEX_SECONDS, INDEX_BYTES). A word in none of them is not named."""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass

# numpy is imported in the functions that use it: only a reachability scan does (at the top, it put
# 12 MiB into memdiag's RSS for every diagnosis, Python target or not)
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
    TPFLAGS_HEAPTYPE,
    TPFLAGS_LIST_SUBCLASS,
    TPFLAGS_TUPLE_SUBCLASS,
    TPFLAGS_TYPE_SUBCLASS,
)
from .memory import Memory
from .target import PythonProcess

MAX_ITEMS = 1 << 20  # items of one container indexed (8 MiB of pointers)
MAX_READ_ITEMS = 4 << 20  # items of one container read, a sample of MAX_ITEMS of them kept (32 MiB)
MAX_ARRAY = 1 << 40  # a container's item array as a range: its length is the target's to claim
MAX_DESCEND = 10_000  # a global container's items looked into for containers of their own
INDEX_SECONDS = 3.0  # the index of globals stops after this much of memdiag's CPU (the target runs on)
INDEX_BYTES = 32 << 20  # and after reading this much of the target's memory
_CONTAINERS = TPFLAGS_LIST_SUBCLASS | TPFLAGS_TUPLE_SUBCLASS | TPFLAGS_DICT_SUBCLASS
MAX_TP_NAME = 128
_ARTICLE = {"list": "a list", "tuple": "a tuple", "dict": "a dict", "set": "a set"}


@dataclass(frozen=True)
class _Global:
    name: str  # module.attribute
    kind: str  # its type's name
    where: str = ""  # a namespace exec() ran code in, not a module: what it ran ("leakyweb.py")


class Holders:
    """Module globals of one CPython process, and the objects and item arrays they hold."""

    def __init__(
        self,
        proc: PythonProcess,
        memory: Memory,
        seconds: float = INDEX_SECONDS,
        frame_globals: dict[int, str | None] | None = None,
    ):
        self.proc, self.mem, self.lay = proc, memory, proc.layout
        # the globals of the frames the walk recorded -> the file of a frame that ran with them: the
        # ones no module owns are namespaces exec() ran code in (twistd -y runs a .tac so)
        self.frame_globals = frame_globals or {}
        self.codes = Codes(proc, memory)
        self.seconds = seconds  # the index stops there (partial: a holder may be missed, never invented)
        self.partial = False
        self._types: dict[int, tuple[str, int] | None] = {}
        self._globals: list[_Global] = []
        self._by_address: dict[int, int] = {}  # a global's object -> its index in _globals
        self._held: list[tuple[object, int]] = []  # (addresses of objects a global's containers hold, its index)
        self._addr = self._who = None  # the held objects' addresses in order, and whose each is
        self._arrays: list[tuple[int, int, int]] = []  # a global list's or tuple's item array
        self._indexed = False
        self._deadline = 0.0
        self._start_bytes = 0

    # --- naming ---------------------------------------------------------------------------
    def name(self, word: int, block: int, size: int = 0) -> str | None:
        """What holds the block at `block` through the pointer at address `word`, or None. A block
        that holds small objects (a pymalloc arena, whose own pool lists point at it) is held by
        the global whose container holds most of the objects inside it."""
        self._index()
        for lo, hi, g in self._arrays:
            if lo <= word < hi:
                return _said(self._globals[g])
        for address in (self.object_at(word), self.object_start(block)):
            if address is None:
                continue
            g = self._by_address.get(address)
            g = self._holder_of(address) if g is None else g
            if g is not None:
                return _said(self._globals[g])
        g = self._held_inside(block, block + size) if size else None
        return _said(self._globals[g]) if g is not None else None

    def _holder_of(self, address: int) -> int | None:
        import numpy as np

        i = int(np.searchsorted(self._addr, address))
        return int(self._who[i]) if i < len(self._addr) and int(self._addr[i]) == address else None

    def _held_inside(self, lo: int, hi: int) -> int | None:
        """The global holding the most of the objects that lie in [lo, hi)."""
        import numpy as np

        first, last = np.searchsorted(self._addr, [lo, hi])
        if first == last:
            return None
        return int(np.bincount(self._who[first:last]).argmax())

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
        import numpy as np

        if self._indexed:
            return
        self._indexed = True
        lay, mem = self.lay, self.mem
        self._deadline = time.thread_time() + self.seconds  # memdiag's own CPU: others' load does not count
        self._start_bytes = self.mem.bytes
        interp = mem.u64(self.proc.interpreters_head)
        modules = mem.u64(interp + lay.interp_modules) if interp else None
        # (name, address, defining module, exec'd namespace) of every global that may be a class
        classes: list[tuple[str, int, str | None, str]] = []
        module_dicts: set[int] = set()
        for key, module in self.dict_items(modules or 0):
            modname = self.codes.string(key)
            if modname is None or mem.u64(module + lay.ob_type) != self.proc.types.get("PyModule_Type"):
                continue
            d = mem.u64(module + lay.module_dict) or 0
            module_dicts.add(d)
            classes += self._add_namespace(d, modname, "")
        for d, ran in self.frame_globals.items():
            if d in module_dicts or self._late():
                continue
            t = self.type_of(d)
            if t is None or not t[1] & TPFLAGS_DICT_SUBCLASS:
                continue  # not a dict (a torn frame): nothing is read of it
            name = self._global_str(d, "__name__")
            where = name or os.path.basename(self._global_str(d, "__file__") or ran or "") or "code exec() ran"
            classes += self._add_namespace(d, None, where, name)
        # a class's own containers (`class Orders: failed = []`), under the module that defines it
        # (one imported elsewhere by name is the same class, named once)
        seen: set[int] = set()
        for name, cls, modname, where in classes:
            if self._late():
                break
            if cls not in seen:
                seen.add(cls)
                self._add_class(name, cls, modname, where)
        # then the containers inside global containers, once every global's own items are in
        for items, g in list(self._held):
            if len(items) <= MAX_DESCEND and not self._late():
                self._descend(items, g)
        held = [a for a, _ in self._held] or [np.zeros(0, dtype=np.uint64)]
        who = [np.full(len(a), g, dtype=np.int64) for a, g in self._held] or [np.zeros(0, dtype=np.int64)]
        addr, owner = np.concatenate(held), np.concatenate(who)
        order = np.argsort(addr, kind="stable")
        self._addr, self._who = addr[order], owner[order]

    def _add_namespace(
        self, d: int, modname: str | None, where: str, name: str | None = None
    ) -> list[tuple[str, int, str | None, str]]:
        """A module's or an exec'd namespace's globals, indexed; the ones that may be classes."""
        classes = []
        for k, value in self.dict_items(d):
            if self._late():
                break
            attr = self.codes.string(k)
            if attr is None or (attr.startswith("__") and attr.endswith("__")):
                continue  # __builtins__, __loader__, ...: the interpreter's, not the program's
            full = f"{modname}.{attr}" if modname else attr
            self._add(full, value, where)
            classes.append((full, value, modname or name, where))
        return classes

    def _global_str(self, d: int, key: str) -> str | None:
        """The str a namespace holds under key (`__name__`, `__file__`), or None."""
        for k, v in self.dict_items(d):
            if self.codes.string(k) == key:
                return self.codes.string(v)
        return None

    def _add(self, name: str, value: int, where: str = "") -> None:
        t = self.type_of(value)
        if t is None:
            return
        g = len(self._globals)
        self._globals.append(_Global(name, t[0], where))
        self._by_address.setdefault(value, g)
        self._held.append((self.items(value, t, g), g))

    def _add_class(self, name: str, cls: int, modname: str | None, where: str = "") -> None:
        """The containers among a class's own attributes, as `module.Class.attribute`."""
        lay, mem = self.lay, self.mem
        t = self.type_of(cls)
        if t is None or not t[1] & TPFLAGS_TYPE_SUBCLASS:
            return  # not a class
        flags = mem.u64(cls + lay.tp_flags) or 0
        if not flags & TPFLAGS_HEAPTYPE:
            return  # a static type of the interpreter's or an extension's: not the program's
        attrs = {self.codes.string(k): v for k, v in self.dict_items(mem.u64(cls + lay.type_dict) or 0)}
        if "__module__" in attrs and modname is not None and self.codes.string(attrs["__module__"]) != modname:
            return  # imported into this module: its own module names it
        for attr, value in attrs.items():
            if attr is None or (attr.startswith("__") and attr.endswith("__")) or self._late():
                continue
            inner = self.type_of(value)
            if inner is not None and (
                inner[1] & _CONTAINERS or mem.u64(value + lay.ob_type) == self.proc.types.get("PySet_Type")
            ):
                self._add(f"{name}.{attr}", value, where)

    def _descend(self, items, g: int) -> None:
        """The items of the containers among a global container's items (a dict of dicts: a
        cache's entries), held by the same global."""
        for item in items.tolist():
            if self._late():
                return
            inner = self.type_of(item)
            if inner is not None and inner[1] & _CONTAINERS:
                self._held.append((self.items(item, inner, g), g))

    def _late(self) -> bool:
        """Past the index's time or bytes (what is left of the memory bound names the blocks)."""
        if time.thread_time() > self._deadline or self.mem.bytes - self._start_bytes > INDEX_BYTES:
            self.partial = True
        return self.partial

    def items(self, obj: int, t: tuple[str, int], g: int):
        """The objects (addresses, numpy) a list, tuple, dict (values) or set holds; a list's or
        tuple's item array is kept as a range, so a word inside it names the container."""
        import numpy as np

        lay, mem, types = self.lay, self.mem, self.proc.types
        flags, none = t[1], np.zeros(0, dtype=np.uint64)
        if flags & (TPFLAGS_LIST_SUBCLASS | TPFLAGS_TUPLE_SUBCLASS):
            n = mem.i64(obj + lay.ob_size) or 0
            # a list's items are an array of their own; a tuple's follow its header
            array = (mem.u64(obj + lay.list_items) or 0) if flags & TPFLAGS_LIST_SUBCLASS else obj + lay.tuple_items
            if n <= 0 or not array:
                return none
            self._arrays.append((array, array + 8 * min(n, MAX_ARRAY), g))  # a word inside it names it
            # a longer container is read up to MAX_READ_ITEMS and kept a sample of MAX_ITEMS of them
            # (a service's list of millions named nothing before): an arena of small objects holds
            # thousands of them, so every k-th item still names the arenas it lies in
            read = min(n, MAX_READ_ITEMS)
            words = self._words(array, read)[:: -(-read // MAX_ITEMS)]
            return words[words != 0]
        if flags & TPFLAGS_DICT_SUBCLASS:
            pairs = self._dict_words(obj)
            return pairs[pairs[:, 0] != 0, 1] if len(pairs) else none
        if mem.u64(obj + lay.ob_type) == types.get("PySet_Type"):
            mask = mem.i64(obj + lay.set_mask) or 0
            table = mem.u64(obj + lay.set_table) or 0
            if not 0 <= mask < MAX_ITEMS or not table:
                return none
            keys = self._words(table, 2 * (mask + 1))[0::2]
            return keys[keys != 0]
        return none

    def _words(self, address: int, count: int):
        import numpy as np

        data = self.mem.read(address, 8 * count)
        return np.frombuffer(data, dtype="<u8") if data is not None else np.zeros(0, dtype=np.uint64)

    def dict_items(self, d: int) -> list[tuple[int, int]]:
        """(key, value) pairs of a dict with a combined table (module dicts are; a split table,
        an instance's, yields nothing)."""
        pairs = self._dict_words(d)
        return [(int(k), int(v)) for k, v in pairs.tolist() if k and v]

    def _dict_words(self, d: int):
        """The (key, value) words of a combined-table dict's entries, as an (n, 2) array."""
        import numpy as np

        lay, mem = self.lay, self.mem
        empty = np.zeros((0, 2), dtype=np.uint64)
        if not d:
            return empty
        keys, values = mem.u64(d + lay.dict_keys), mem.u64(d + lay.dict_values)
        head = mem.read(keys, lay.keys_indices) if keys and not values else None
        if head is None:
            return empty
        index_bytes, kind = 1 << head[lay.keys_log2_index_bytes], head[lay.keys_kind]
        n = struct.unpack_from("<q", head, lay.keys_nentries)[0]
        width = 3 if kind == DICT_KEYS_GENERAL else 2  # words per entry: (hash,) key, value
        if not 0 < n <= MAX_ITEMS or index_bytes > 8 * MAX_ITEMS:
            return empty
        words = self._words(keys + lay.keys_indices + index_bytes, n * width)
        if len(words) != n * width:
            return empty
        entries = words.reshape(n, width)[:, width - 2 :]
        return entries[entries[:, 1] != 0]


def _said(g: _Global) -> str:
    article = _ARTICLE.get(g.kind) or ("an " if g.kind[:1].lower() in "aeiou" else "a ") + g.kind
    return f"`{g.name}` ({article}, a global of {g.where} run by exec())" if g.where else f"`{g.name}` ({article})"
