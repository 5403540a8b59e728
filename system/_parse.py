"""Small parsing helpers shared by the fact readers."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """Base of every model memdiag defines: each is built on first use (defer_build), not when its
    module is imported. The registry imports every probe's face for every target, and a diagnosis
    uses the models its path needs: the kit's leak (30 s) built 54 of memdiag's 127 model classes,
    and not building the rest is 0.6 MiB of its peak RSS (59.4 -> 58.8 MiB, measured)."""

    model_config = ConfigDict(defer_build=True)


class Fact(Model):
    """Base of every fact model: immutable, unknown keys refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def fs_text(name: str) -> str:
    """A name the filesystem gave (a file's, a link's text) as text: bytes that are no UTF-8 (a name is
    a target's to choose) as \\xNN, never the lone surrogates Python decodes them to, which no JSON
    writer takes."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def read_text(path: Path, limit: int | None = None) -> str | None:
    """The file's text (its first `limit` characters where given), or None when it does not exist
    or cannot be read."""
    try:
        if limit is None:
            return path.read_text()
        with open(path, errors="replace") as f:
            return f.read(limit)
    except (FileNotFoundError, NotADirectoryError, PermissionError, ProcessLookupError):
        return None


def lines_of(text: str | Iterable[str]) -> Iterable[str]:
    """A file's lines from its whole text or from the open file itself (line by line: a process's
    smaps is ~1 KiB a mapping, hundreds of MiB for a target that makes 300,000 of them)."""
    return text.splitlines() if isinstance(text, str) else (line.rstrip("\n") for line in text)


def parse_file(path: Path, parse):
    """parse(the open file), read line by line; None when the file cannot be read (gone, no
    permission, the process exited mid-read)."""
    try:
        with open(path, errors="replace") as f:
            return parse(f)
    except (OSError, ProcessLookupError):
        return None


# One string per counter name read, shared by every reading. Not sys.intern: once memdiag's modules
# are imported CPython's table of interned strings is near a resize (2^16 slots hold 43,690 names),
# and the names read pushed it past (tracemalloc: one 1.8 MiB block, the table at 2^17 slots): 0.9
# MiB of memdiag's peak on the kit's leak (60.4 -> 59.5 MiB). The names are the kernel's (a few
# hundred files' keys), so this table stays small.
_NAMES: dict[str, str] = {}


def kv_lines(text: str, sep: str | None = None) -> dict[str, str]:
    """``key value...`` lines (``key: value`` when sep=':') into a dict of raw value strings. The
    keys come from _NAMES: a long window keeps hundreds of samples of the same files, and a cgroup's
    memory.stat alone made 42 new key strings a sample (2.6 KiB of its 13.8 measured here)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if sep is not None:
            key, found, value = line.partition(sep)
            if not found:
                continue
        else:
            parts = line.split(None, 1)
            if len(parts) != 2:
                continue
            key, value = parts
        key = key.strip()
        out[_NAMES.setdefault(key, key)] = value.strip()
    return out


def kib_to_bytes(value: str | None) -> int | None:
    """'123 kB' (the unit /proc uses for KiB) or '123' into bytes."""
    if value is None:
        return None
    words = value.split()
    try:
        return int(words[0]) * 1024
    except (ValueError, IndexError):
        return None


def int_or_none(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None
