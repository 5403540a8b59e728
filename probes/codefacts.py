"""What memdiag read from a file's machine code, remembered across runs, so that a diagnosis of
files it has read before never loads the disassembler.

Three facts are read from code, each a pure function of the file's bytes and of the decoder that
read them: where an allocator entry point's probe goes (allocator.place), where a function that
only jumps lands (allocator._lands_at), and whether a function only forwards an allocation
(forwarders.forwards). capstone, which decodes them, costs memdiag about 10 MiB of its resident
memory (measured on the kit's leak: its Python constants for every architecture it knows, 4.9 MiB;
libcapstone's relocated tables, up to 5 MiB once used): a seventh of the whole diagnosis's peak.

Facts are kept per file, named by its GNU build id (the same library in every container image
that ships it), else by its device, inode, size and modification time, in
/var/lib/memdiag/code-facts.json (MEMDIAG_CODE_FACTS), for the newest MAX_FILES files; the store
carries a checksum of the decoders' own source, so facts read by other code are read again. The
store is written once, when memdiag exits, only where it learnt something; an unreadable or
unwritable store costs the disassembler, never a result."""

from __future__ import annotations

import atexit
import functools
import json
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

STORE = Path(os.environ.get("MEMDIAG_CODE_FACTS", "/var/lib/memdiag/code-facts.json"))
MAX_FILES = 512  # a host's allocators and the programs diagnosed on it; ~1 KiB of JSON each
_DECODERS = ("allocator.py", "forwarders.py")  # what reads the facts: a change to either reads them again

_facts: dict[str, dict[str, Any]] | None = None  # the store as read, with what this run learnt
_learnt: dict[str, dict[str, Any]] = {}  # what this run learnt, to be written
_registered = False


@functools.cache
def _version() -> str:
    here = Path(__file__).parent
    crc = 0
    for name in _DECODERS:
        crc = zlib.crc32((here / name).read_bytes(), crc)
    return f"{crc:08x}"


def _read() -> dict[str, dict[str, Any]]:
    try:
        data = json.loads(STORE.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != _version() or not isinstance(data.get("files"), dict):
        return {}
    return {k: v for k, v in data["files"].items() if isinstance(v, dict)}  # a mangled entry is read again


def file_key(elf) -> str | None:
    """The file's name in the store: its build id, else what stat says of it (None: gone)."""
    build_id = elf.build_id()
    if build_id:
        return f"build-id {build_id}"
    try:
        st = os.stat(elf.path)
    except OSError:
        return None
    return f"file {st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


def remembered(elf, fact: str, read: Callable[[], Any]) -> Any:
    """The fact named `fact` of elf's file (a JSON value): as read before, or read now by `read`."""
    global _facts, _registered
    key = file_key(elf)
    if key is None:
        return read()
    if _facts is None:
        _facts = _read()
    known = _facts.get(key)
    if known is not None and fact in known:
        return known[fact]
    value = read()
    if not _registered:
        atexit.register(save)
        _registered = True
    _facts.setdefault(key, {})[fact] = value
    _learnt.setdefault(key, {})[fact] = value
    return value


def save() -> None:
    """Write what this run learnt, merged into the store as it is now (another memdiag may have
    written it meanwhile), the newest MAX_FILES files kept."""
    if not _learnt:
        return
    files = _read()
    for key, facts in _learnt.items():
        files[key] = {**files.pop(key, {}), **facts}  # to the end: the newest
    files = dict(list(files.items())[-MAX_FILES:])
    try:
        STORE.parent.mkdir(parents=True, exist_ok=True)
        tmp = STORE.with_name(f".{STORE.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"version": _version(), "files": files}, separators=(",", ":")))
        tmp.replace(STORE)  # two memdiags at once: one whole file wins
    except OSError:
        return
    _learnt.clear()
