"""Where CPython sits in one process: the module that defines _PyRuntime (Debian's python3.11
links the interpreter into the executable; other builds into libpython3.X.so), its exact version
(Py_Version, the PY_VERSION_HEX every 3.11+ build exports), the layout for that version, and the
addresses of the objects frames and holders are checked against (PyCode_Type, PyList_Type, ...).

A process is taken only when its memory agrees with the layout: the first thread state's
interpreter is the interpreter it hangs from, and sys.modules is a dict. Otherwise, and for any
version without a layout, the answer is the reason (`unsupported version 3.10.13`), never a walk
with offsets that might be wrong."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

from elftools.elf.sections import SymbolTableSection

from ..elf import ElfInfo, elf_info, note_module
from ..procmaps import AddressSpace
from ..symtab import symbol_rows
from .layout import DEBUG_OFFSETS_BYTES, DEBUG_OFFSETS_VERSIONS, TABLES, Layout, describe_version, from_debug_offsets
from .layout import version_of as _version_of
from .memory import Memory

_MODULE = re.compile(r"^(?:lib)?python(?P<version>3\.\d+)(?P<abi>[a-z]*)(?:\.so[.\d]*)?$")
TYPES = (
    "PyCode_Type",
    "PyType_Type",
    "PyList_Type",
    "PyTuple_Type",
    "PyDict_Type",
    "PyModule_Type",
    "PyBytes_Type",
    "PyByteArray_Type",
    "PyUnicode_Type",
    "PySet_Type",
)


@dataclass(frozen=True)
class PythonProcess:
    """A CPython process memdiag can read frames and objects of."""

    pid: int
    module: str  # the mapped file that defines _PyRuntime
    version: str  # 3.11.2
    layout: Layout
    runtime: int  # address of _PyRuntime in the process
    types: dict[str, int]  # PyCode_Type ... -> its address in the process
    stdlib: str | None  # the interpreter's own library folder (/usr/lib/python3.11), for frame kinds

    @property
    def interpreters_head(self) -> int:
        """Address of _PyRuntime.interpreters.head: where the BPF walk starts."""
        return self.runtime + self.layout.interpreters_head

    def describe(self) -> str:
        return f"CPython {self.version} ({os.path.basename(self.module)}, layout from its {self.layout.source})"


@functools.lru_cache(maxsize=64)
def _data_symbols(elf: ElfInfo) -> dict[str, int]:
    """Exported data symbols of the interpreter's module (.dynsym, else .symtab)."""
    wanted = {"_PyRuntime", "Py_Version", *TYPES}
    found: dict[str, int] = {}
    try:
        for section in (".dynsym", ".symtab"):
            sec = elf.elf.get_section_by_name(section)
            if not isinstance(sec, SymbolTableSection):
                continue
            # the bulk reader, bounded (pyelftools' iter_symbols: ~30 us a symbol, any number of them)
            for name, value, _size, _kind, _bind, shndx in symbol_rows(elf.elf, sec):
                if name in wanted and value and shndx != 0:
                    found.setdefault(name, value)
    except Exception as e:  # noqa: BLE001  (a corrupt or hostile module: no interpreter read from it)
        note_module(elf.path, f"no symbols ({type(e).__name__}: {e})")
        return {}
    return found


def _interpreter_module(space: AddressSpace) -> tuple[str, ElfInfo, int, dict[str, int]] | None:
    """(path, ELF, load bias, data symbols) of the mapped module defining _PyRuntime."""
    for path in space.modules():
        if not _MODULE.match(os.path.basename(path)):
            continue
        mapping = space.first_mapping_of(path)
        elf = elf_info(space.file_path(mapping))
        if elf is None or mapping is None:
            continue
        symbols = _data_symbols(elf)
        bias = elf.bias(mapping)
        if "_PyRuntime" in symbols and bias is not None:
            return path, elf, bias, symbols
    return None


def _layout(elf: ElfInfo, symbols: dict[str, int], name_version: str) -> tuple[Layout | None, str, str]:
    """(layout, version, why not) from the module file: Py_Version, then a table or 3.13's
    _Py_DebugOffsets (both read from the file's initialized data, not from the target)."""
    raw = elf.read_at(symbols["Py_Version"], 4) if "Py_Version" in symbols else None
    if raw is None or len(raw) != 4:  # 3.10 and older have no Py_Version
        return None, name_version, f"unsupported version {name_version}"
    hexversion = int.from_bytes(raw, "little")
    version, minor = describe_version(hexversion), _version_of(hexversion)
    if minor in TABLES:
        return TABLES[minor], version, ""
    if minor in DEBUG_OFFSETS_VERSIONS:
        layout, why = from_debug_offsets(elf.read_at(symbols["_PyRuntime"], DEBUG_OFFSETS_BYTES) or b"")
        return layout, version, why
    return None, version, f"unsupported version {version}"


def _stdlib(module: str, minor: str) -> str | None:
    """The library folder of the interpreter that module belongs to: PREFIX/lib/python3.X for a
    PREFIX/bin/python3.X or PREFIX/lib/libpython3.X.so."""
    parent = os.path.dirname(module)
    if os.path.basename(parent) in ("bin", "lib", "lib64"):
        return os.path.join(os.path.dirname(parent), "lib", f"python{minor}")
    return None


def locate(pid: int, space: AddressSpace | None, memory: Memory) -> tuple[PythonProcess | None, str]:
    """The CPython of pid, or None and why not ("" when the process is no CPython at all)."""
    if space is None:
        return None, ""
    found = _interpreter_module(space)
    if found is None:
        return None, ""
    path, elf, bias, symbols = found
    m = _MODULE.match(os.path.basename(path))
    minor = m["version"] if m else "3"
    if m and "t" in m["abi"]:
        return None, f"unsupported build: free-threaded CPython {minor}"
    if m and "d" in m["abi"]:  # debug builds add fields to every object header
        return None, f"unsupported build: debug CPython {minor}"
    layout, version, why = _layout(elf, symbols, minor)
    if layout is None:
        return None, why
    if not layout.frame_fields_fit():
        return None, f"unsupported version {version}: its frame fields lie beyond what the BPF walk reads"
    proc = PythonProcess(
        pid=pid,
        module=path,
        version=version,
        layout=layout,
        runtime=symbols["_PyRuntime"] + bias,
        types={name: symbols[name] + bias for name in TYPES if name in symbols},
        stdlib=_stdlib(path, minor),
    )
    mismatch = _check(proc, memory)
    if mismatch:
        return None, f"CPython {version}: {mismatch}; nothing of it is read (unsupported build)"
    return proc, ""


def _check(proc: PythonProcess, mem: Memory) -> str:
    """What in the process's memory disagrees with its layout, or "" when it agrees."""
    lay = proc.layout
    if "PyCode_Type" not in proc.types or "PyDict_Type" not in proc.types:
        return "its module exports no PyCode_Type or PyDict_Type"
    interp = mem.u64(proc.interpreters_head)
    if not interp:
        return "no interpreter at _PyRuntime.interpreters.head (not initialized, or another layout)"
    tstate = mem.u64(interp + lay.interp_threads_head)
    if tstate and mem.u64(tstate + lay.tstate_interp) != interp:
        return "its first thread state does not point back at its interpreter"
    modules = mem.u64(interp + lay.interp_modules)
    if modules and mem.u64(modules + lay.ob_type) != proc.types["PyDict_Type"]:
        return "sys.modules is not where the layout says (not a dict)"
    return ""


def frames_readable(pid: int) -> str | None:
    """ "read" when memdiag can read pid's Python frames, else why not ("unsupported version
    3.10.13"). For the fact target.python_frames of a CPython target."""
    with Memory(pid) as memory:
        proc, why = locate(pid, AddressSpace.of(pid), memory)
    if proc is not None:
        return "read"
    return why or "its interpreter's module defines no _PyRuntime symbol"
