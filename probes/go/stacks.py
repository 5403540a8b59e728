"""Go frames in native stacks (a page fault's, an mmap's): an address in a Go executable named by
the binary's own function table, inlined calls included, so a fault in runtime.memclrNoHeapPointers
under main.main names main.rememberFailure, which the compiler inlined into main.main. A native
symbol table names only main.main, and a stripped Go binary (the distributions') names nothing."""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from ..elf import elf_info
from ..elf import note_module as note
from ..frame import Frame
from ..procmaps import AddressSpace, Mapping

if TYPE_CHECKING:
    from .pclntab import GoTable


def _table(path: str) -> GoTable | None:
    """The file's Go function table, or None: not a Go executable (no .gopclntab section), or one
    this reader does not read (another layout: its frames stay the native symbolizer's)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _table_of(st.st_dev, st.st_ino, st.st_mtime_ns, path)


@functools.lru_cache(maxsize=256)
def _table_of(_dev: int, _ino: int, _mtime: int, path: str) -> GoTable | None:
    elf = elf_info(path)
    if elf is None or elf.elf.get_section_by_name(".gopclntab") is None:
        return None
    # imported here: every native frame's file is asked, and only a Go executable reads on
    from .pclntab import PclntabError, go_table

    try:
        return go_table(path)
    except PclntabError:
        return None
    except Exception as e:  # noqa: BLE001  (a corrupt or hostile file: its frames stay the native symbolizer's)
        note(path, f"no Go function table ({type(e).__name__}: {e})")
        return None


def go_frames(space: AddressSpace | None, mapping: Mapping, address: int, leaf: bool):
    """The frames at address (innermost first) when it is a Go function's code, else None. A
    return address is looked up one byte back, in the call (leaf: the address is the instruction)."""
    path = space.file_path(mapping) if space else None
    table = _table(path) if path else None
    if table is None:
        return None
    elf = elf_info(path)
    bias = elf.bias(mapping) if elf is not None else None
    if bias is None:
        return None
    try:
        found = table.frames(address - bias - (0 if leaf else 1))
    except Exception as e:  # noqa: BLE001  (the table is read lazily: a corrupt entry fails here)
        note(path, f"no Go frames ({type(e).__name__}: {e})")
        return None
    if not found:
        return None
    return [
        Frame(
            address=address,
            function=f.function,
            module=mapping.path,
            source=(f"{f.file.rsplit('/', 1)[-1]}:{f.line}" if f.file and f.line else "?")
            + (", inlined" if f.inlined else ""),
        )
        for f in found
    ]
