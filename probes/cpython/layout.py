"""Where CPython keeps what memdiag reads, by version: the offsets of the fields walked from
_PyRuntime to the current frame (thread states, frames), of code objects, and of the objects the
holder of a block is named from (type, list, dict, module, str, bytes).

3.11 and 3.12 have no published layout: their offsets are tables here, taken with gdb's
`ptype /o` from the DWARF of CPython 3.11.7 and 3.12.1 builds and checked on Debian's 3.11.2
(target.py checks every process against its table before anything is walked). 3.13 publishes
_Py_DebugOffsets at the start of _PyRuntime (Include/internal/pycore_runtime.h, the struct py-spy
and the OpenTelemetry profiler read); the fields it does not carry (dict internals, module
objects, string headers, a frame's f_globals) are unchanged from 3.12 in 3.13.0's DWARF. Any other version is
unsupported: its layout is unknown, so nothing of it is read (never a guess)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace

from memdiag.system.runtime import describe_python_version as describe_version

# bpf/pyframes.h reads PY_FRAME_READ bytes of a frame at once: every frame field must lie inside.
PY_FRAME_READ = 72
# Object flags (Include/object.h, the same 3.11-3.13): tp_flags bits.
TPFLAGS_HAVE_GC = 1 << 14
TPFLAGS_LIST_SUBCLASS, TPFLAGS_TUPLE_SUBCLASS = 1 << 25, 1 << 26
TPFLAGS_DICT_SUBCLASS, TPFLAGS_TYPE_SUBCLASS = 1 << 29, 1 << 31
TPFLAGS_HEAPTYPE = 1 << 9  # a class made at run time (a `class` statement), not one of C's static types
DICT_KEYS_GENERAL = 0  # dk_kind: entries of (hash, key, value); other kinds hold (key, value)
# pymalloc (Objects/obmalloc.c) on 64-bit builds with its radix tree (3.10+): 1 MiB arenas of
# 16 KiB pools, each opened by a 48-byte pool_header, blocks in 16-byte size classes up to 512.
# Checked here by the mmap sizes of Debian's 3.11 and pyenv's 3.12/3.13 (1,048,576 bytes) and
# by pool headers read back (szidx, maxnextoffset); holder.py checks every header it uses.
ARENA_SIZE = 1 << 20
POOL_SIZE = 16 << 10
POOL_OVERHEAD = 48
POOL_SZIDX, POOL_MAXNEXT = 36, 44  # offsets of pool_header.szidx and .maxnextoffset
SMALL_ALIGNMENT, SMALL_MAX = 16, 512
PY_NO_FIELD = 0xFFFF
PY_NO_OWNER = 0xFF
DEBUG_COOKIE = b"xdebugpy"


@dataclass(frozen=True)
class Layout:
    """Offsets in bytes (None: no such field in this version)."""

    version: tuple[int, int]
    source: str  # how the offsets were had: "table" or "_Py_DebugOffsets"
    # _PyRuntimeState, PyInterpreterState, PyThreadState, _PyCFrame
    interpreters_head: int
    interp_threads_head: int
    interp_modules: int  # sys.modules (3.11: modules; 3.12+: imports.modules)
    tstate_next: int
    tstate_interp: int
    tstate_native_thread_id: int
    tstate_frame: int  # cframe (3.11, 3.12) or current_frame (3.13)
    cframe_current_frame: int | None
    # _PyInterpreterFrame
    frame_code: int  # f_code (3.13: f_executable)
    frame_previous: int
    frame_instr: int  # prev_instr (3.13: instr_ptr)
    frame_is_entry: int | None  # 3.11 only
    frame_owner: int
    owner_cstack: int | None  # FRAME_OWNED_BY_CSTACK (3.12+)
    frame_globals: int  # f_globals
    # PyCodeObject
    code_filename: int
    code_name: int
    code_qualname: int
    code_linetable: int
    code_firstlineno: int
    code_adaptive: int  # co_code_adaptive: the first code unit
    # objects (PyObject_HEAD, PyVarObject, type, bytes, str, list, tuple, dict, module)
    ob_type: int = 8
    ob_size: int = 16
    tp_name: int = 24
    tp_flags: int = 168
    bytes_sval: int = 32
    str_length: int = 16
    str_state: int = 32
    str_ascii_size: int = 40  # sizeof(PyASCIIObject): compact ASCII data follows
    str_compact_size: int = 56  # sizeof(PyCompactUnicodeObject): other compact data follows
    list_items: int = 24
    tuple_items: int = 24
    dict_used: int = 16
    dict_keys: int = 32
    dict_values: int = 40
    keys_log2_size: int = 8
    keys_log2_index_bytes: int = 9
    keys_kind: int = 10
    keys_nentries: int = 24
    keys_indices: int = 32
    set_mask: int = 32
    set_table: int = 40
    type_dict: int = 264  # PyTypeObject.tp_dict (a class's own attributes)
    module_dict: int = 16
    gc_head: int = 16  # PyGC_Head before a GC-tracked object

    def py_proc(self, interpreters_head_addr: int) -> dict[str, int]:
        """The fields of bpf/memdiag.h's struct py_proc for a process whose
        _PyRuntime.interpreters.head is at that address."""
        none = PY_NO_FIELD
        return {
            "interp_head": interpreters_head_addr,
            "interp_threads": self.interp_threads_head,
            "tstate_next": self.tstate_next,
            "tstate_tid": self.tstate_native_thread_id,
            "tstate_frame": self.tstate_frame,
            "cframe_frame": none if self.cframe_current_frame is None else self.cframe_current_frame,
            "frame_code": self.frame_code,
            "frame_previous": self.frame_previous,
            "frame_instr": self.frame_instr,
            "frame_entry": none if self.frame_is_entry is None else self.frame_is_entry,
            "frame_owner": self.frame_owner,
            "frame_globals": self.frame_globals,
            "owner_cstack": PY_NO_OWNER if self.owner_cstack is None else self.owner_cstack,
        }

    def frame_fields_fit(self) -> bool:
        """Every frame field walked lies in the PY_FRAME_READ bytes the BPF walk reads."""
        fields = [(self.frame_code, 8), (self.frame_previous, 8), (self.frame_instr, 8), (self.frame_owner, 1)]
        fields.append((self.frame_globals, 8))
        if self.frame_is_entry is not None:
            fields.append((self.frame_is_entry, 1))
        return all(off + size <= PY_FRAME_READ for off, size in fields)


_PY311 = Layout(
    version=(3, 11),
    source="table",
    interpreters_head=40,
    interp_threads_head=16,
    interp_modules=888,
    tstate_next=8,
    tstate_interp=16,
    tstate_native_thread_id=160,
    tstate_frame=56,
    cframe_current_frame=8,
    frame_code=32,
    frame_previous=48,
    frame_instr=56,
    frame_is_entry=68,
    frame_owner=69,
    owner_cstack=None,
    frame_globals=8,
    code_filename=112,
    code_name=120,
    code_qualname=128,
    code_linetable=136,
    code_firstlineno=72,
    code_adaptive=184,
    str_ascii_size=48,  # 3.11 still has wstr
    str_compact_size=72,
)
_PY312 = Layout(
    version=(3, 12),
    source="table",
    interpreters_head=40,
    interp_threads_head=72,
    interp_modules=944,
    tstate_next=8,
    tstate_interp=16,
    tstate_native_thread_id=144,
    tstate_frame=56,
    cframe_current_frame=0,
    frame_code=0,
    frame_previous=8,
    frame_instr=56,
    frame_is_entry=None,
    frame_owner=70,
    owner_cstack=3,
    frame_globals=24,
    code_filename=112,
    code_name=120,
    code_qualname=128,
    code_linetable=136,
    code_firstlineno=68,
    code_adaptive=192,
)
TABLES = {(3, 11): _PY311, (3, 12): _PY312}
# The versions whose _Py_DebugOffsets struct is parsed here (its own layout changes by version).
DEBUG_OFFSETS_VERSIONS = ((3, 13),)

# _Py_DebugOffsets of 3.13, field by field (all uint64 after the 8-byte cookie), in order.
_DEBUG_313 = tuple(
    name
    for group in (
        "version free_threaded",
        "rt_size rt_finalizing rt_interpreters_head",
        "is_size is_id is_next is_threads_head is_gc is_imports_modules is_sysdict is_builtins is_ceval_gil",
        "is_gil_runtime_state is_gil_enabled is_gil_locked is_gil_holder",
        "ts_size ts_prev ts_next ts_interp ts_current_frame ts_thread_id ts_native_thread_id ts_datastack ts_status",
        "fr_size fr_previous fr_executable fr_instr_ptr fr_localsplus fr_owner",
        "co_size co_filename co_name co_qualname co_linetable co_firstlineno co_argcount co_localsplusnames",
        "co_localspluskinds co_code_adaptive",
        "ob_size_ ob_type",
        "ty_size ty_tp_name ty_tp_repr ty_tp_flags",
        "tu_size tu_ob_item tu_ob_size",
        "li_size li_ob_item li_ob_size",
        "di_size di_ma_keys di_ma_values",
        "fl_size fl_ob_fval",
        "lo_size lo_lv_tag lo_ob_digit",
        "by_size by_ob_size by_ob_sval",
        "un_size un_state un_length un_asciiobject_size",
        "gc_size gc_collecting",
    )
    for name in group.split()
)
DEBUG_OFFSETS_BYTES = len(DEBUG_COOKIE) + 8 * len(_DEBUG_313)


def version_of(hexversion: int) -> tuple[int, int]:
    return (hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF


def from_debug_offsets(data: bytes) -> tuple[Layout | None, str]:
    """The layout a 3.13 _Py_DebugOffsets gives (the first DEBUG_OFFSETS_BYTES of _PyRuntime),
    or None and why not (no cookie, another version's struct, a free-threaded build)."""
    if len(data) < DEBUG_OFFSETS_BYTES or not data.startswith(DEBUG_COOKIE):
        return None, "no _Py_DebugOffsets at the start of _PyRuntime"
    values = dict(zip(_DEBUG_313, struct.unpack_from(f"<{len(_DEBUG_313)}Q", data, len(DEBUG_COOKIE)), strict=True))
    version = version_of(values["version"])
    if version not in DEBUG_OFFSETS_VERSIONS:
        return None, f"unsupported version {describe_version(values['version'])} (its _Py_DebugOffsets is not read)"
    if values["free_threaded"]:
        return None, f"unsupported build: free-threaded CPython {describe_version(values['version'])}"
    v = values
    return (
        replace(
            _PY312,
            version=version,
            source="_Py_DebugOffsets",
            interpreters_head=v["rt_interpreters_head"],
            interp_threads_head=v["is_threads_head"],
            interp_modules=v["is_imports_modules"],
            tstate_next=v["ts_next"],
            tstate_interp=v["ts_interp"],
            tstate_native_thread_id=v["ts_native_thread_id"],
            tstate_frame=v["ts_current_frame"],
            cframe_current_frame=None,
            frame_code=v["fr_executable"],
            frame_previous=v["fr_previous"],
            frame_instr=v["fr_instr_ptr"],
            frame_owner=v["fr_owner"],
            owner_cstack=3,  # FRAME_OWNED_BY_CSTACK, Include/internal/pycore_frame.h of 3.13
            code_filename=v["co_filename"],
            code_name=v["co_name"],
            code_qualname=v["co_qualname"],
            code_linetable=v["co_linetable"],
            code_firstlineno=v["co_firstlineno"],
            code_adaptive=v["co_code_adaptive"],
            ob_type=v["ob_type"],
            tp_name=v["ty_tp_name"],
            tp_flags=v["ty_tp_flags"],
            bytes_sval=v["by_ob_sval"],
            str_length=v["un_length"],
            str_state=v["un_state"],
            str_ascii_size=v["un_asciiobject_size"],
            str_compact_size=v["un_asciiobject_size"] + 16,  # utf8_length, utf8
            list_items=v["li_ob_item"],
            tuple_items=v["tu_ob_item"],
            dict_keys=v["di_ma_keys"],
            dict_values=v["di_ma_values"],
        ),
        "",
    )
