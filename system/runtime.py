"""What tells a language runtime in a process, and its version, from what the process maps and its
own files: for an interpreter or a virtual machine, native stacks name the runtime's functions
(PyByteArray_Resize, v8::internal::Heap::AllocateExternalBackingStore, os::malloc), never the
program's own code, and a Go program allocates from its own heap, which malloc probes never see.
The language-level view needs the runtime's own instruments. These are the readers; each runtime's
face (probes/NAME/__init__.py) says which of them tells it, and the registry's list of runtimes
(probes/registry.py) recognises a process's runtime with them.

- CPython: an executable mapping of `libpython3.X.so` or of a `python3.X` binary (Debian's python3
  links the interpreter in); the version is in the name.
- JVM: `libjvm.so` mapped; the version from the JDK's `release` file (JAVA_VERSION), else the
  JDK folder's name. The release file is the target's to plant: it is opened inside the target's
  root (safefile: no link out of it, no FIFO or device, MAX_RELEASE bytes), used only where the
  JVM's own user could read it (a link to a root-only file of the host's is not), and only a
  version-shaped JAVA_VERSION is believed.
- Node/V8: the `node` binary or `libnode.so` mapped; the versions from the strings Node compiles
  in (process.release's source URL, V8's version).
- Go: the executable carries the build info the Go linker writes (`.go.buildinfo`: the toolchain's
  version and the main module), kept by `strip` and `-ldflags=-s` alike (`go version FILE` reads
  the same); without section headers, the blob is searched at the start of the first writable
  segment, as Go's debug/buildinfo does.

Files are read through /proc/PID/map_files and /proc/PID/exe (the very inodes mapped and run), and
a JDK's `release` inside the target's root, so a containerized target's own files are the ones
read, and never a file the target points elsewhere."""

from __future__ import annotations

import mmap
import os
import re
import stat
import struct
from pathlib import Path

from elftools.elf.elffile import ELFFile

from ._parse import Fact, kv_lines, read_text
from .elfread import open_elf, segment_bytes, segment_headers
from .process import effective_ids
from .safefile import open_in, open_root, read_fd

_CPYTHON = re.compile(r"^(?:lib)?python(?P<version>3\.\d+)[a-z]*(?:\.so[.\d]*|-[\w.-]+)?$")
_NODE = re.compile(r"^(?:node|nodejs|libnode\.so[.\d]*)$")
_JVM = "libjvm.so"
MAX_RELEASE = 64 << 10  # a JDK's release file is 1-2 KiB
# What a JDK's release file says that memdiag repeats: a version ("17.0.15", "1.8.0_392", "25"),
# an implementor's and a runtime version's words, each short
_JAVA_VERSION = re.compile(r"^[0-9][0-9A-Za-z._+-]{0,39}$")
_RELEASE_WORDS = re.compile(r"^[\w .,+()-]{1,80}$")
# Node's process.release.sourceUrl and V8's version string (V8_VERSION_STRING, "-node.N" on Node's own)
_NODE_RELEASE = re.compile(rb"nodejs\.org/download/release/v(\d+\.\d+\.\d+)/")
_V8_VERSION = re.compile(rb"\x00(\d+\.\d+\.\d+\.\d+-node\.\d+)\x00")
# A JDK folder's name: java-17-openjdk-amd64, jdk-21.0.2, temurin-25-jdk-amd64, zulu11...
_JDK_DIR = re.compile(r"(?:java|jdk|jre|openjdk|temurin|zulu|corretto)-?(\d+(?:\.\d+)*)")
_GO_MAGIC = b"\xff Go buildinf:"
_BUILDINFO_ALIGN, _BUILDINFO_HEADER = 16, 32


class Runtime(Fact):
    name: str  # the runtime face's name (probes/registry.py RUNTIMES): what target.runtime says
    label: str  # how a person names it: its face's display name
    version: str | None  # None: the runtime is recognised, its version could not be read
    module: str  # the mapped file holding the runtime's code (the executable for Go)
    detail: str | None = None  # V8's version, the JDK's build, a Go program's main module

    def describe(self) -> str:
        """One line for the report: `Go 1.19.8 (/usr/bin/prometheus; module github.com/...)`."""
        version = self.version or "(version unknown)"
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.label} {version} ({self.module}{extra})"


class GoBuild(Fact):
    """What the Go linker wrote into the executable (`go version -m FILE` shows the same)."""

    version: str  # the toolchain's, as runtime.Version() says it: go1.19.8
    main_module: str | None = None  # the `path` line of the module info, None when built without modules


def executable_mappings(maps: str):
    """(address range as map_files names it, path) of each executable file mapping of
    /proc/PID/maps, in address order."""
    for line in maps.splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and "x" in fields[1]:
            start, _, end = fields[0].partition("-")
            try:  # maps pads to 8 digits; map_files does not
                span = f"{int(start, 16):x}-{int(end, 16):x}"
            except ValueError:
                continue
            # a file replaced since it was mapped (a package upgraded under a running service) is
            # "(deleted)" in maps and still the runtime it was
            yield span, fields[5].strip().removesuffix(" (deleted)")


def effective_ids_of(pid: int, proc_root: Path = Path("/proc")) -> tuple[int, int] | None:
    """The process's effective uid and gid (a file it could not read is not read for it)."""
    return effective_ids(read_text(proc_root / str(pid) / "status") or "")


def cpython_module_minor(base: str) -> str | None:
    """3.X when a file of this name is CPython's code (libpython3.X.so, python3.X), else None."""
    m = _CPYTHON.match(base)
    return m["version"] if m else None


def is_jvm_module(base: str) -> bool:
    """A file of this name is HotSpot's code (libjvm.so)."""
    return base == _JVM


def is_node_module(base: str) -> bool:
    """A file of this name is Node's code (node, nodejs, libnode.so)."""
    return bool(_NODE.match(base))


def maps_node(maps: str) -> bool:
    """Whether the process maps Node's code executable, from /proc/PID/maps alone."""
    return any(is_node_module(path.rsplit("/", 1)[-1]) for _, path in executable_mappings(maps))


# --- JVM ---------------------------------------------------------------------------------------
def parse_jdk_release(text: str) -> dict[str, str]:
    """A JDK's `release` file (KEY="value" lines) into its values, quotes removed."""
    return {k: v.strip().strip('"') for k, v in kv_lines(text, sep="=").items()}


def read_jdk_release(root: Path, path: str, ids: tuple[int, int] | None = None) -> str | None:
    """A JDK's release file at `path` in the target's root: inside that root, a regular file, at most
    MAX_RELEASE bytes, and readable by the target's own user (ids: its uid and gid; root reads all),
    so that a link to a file only root may read is not read for it. None where it is not."""
    try:
        rfd = open_root(root)
    except OSError:
        return None
    try:
        fd = open_in(rfd, path)
    except OSError:
        return None
    finally:
        os.close(rfd)
    try:
        if ids is not None and not _readable_by(os.fstat(fd), *ids):
            return None
        data, truncated = read_fd(fd, MAX_RELEASE)
    except OSError:
        return None
    finally:
        os.close(fd)
    return None if truncated else data.decode("utf-8", "replace")


def _readable_by(st: os.stat_result, uid: int, gid: int) -> bool:
    """Whether the file's mode lets this user read it (root reads all)."""
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def jvm_version(libjvm: str, root: Path, ids: tuple[int, int] | None = None) -> tuple[str | None, str | None]:
    """(version, detail) of the JDK whose libjvm.so this is: its `release` file (lib/server/libjvm.so
    sits two folders below the JDK's home, JDK 8's jre/lib/amd64/server four), else its folder's name."""
    parents = Path(libjvm.removesuffix(" (deleted)")).parents
    for up in range(1, min(5, len(parents))):
        text = read_jdk_release(root, str(parents[up] / "release"), ids)
        if text is None:
            continue
        values = parse_jdk_release(text)
        version = values.get("JAVA_VERSION", "")
        if _JAVA_VERSION.match(version):
            words = (values.get("IMPLEMENTOR"), values.get("JAVA_RUNTIME_VERSION"))
            build = " ".join(x for x in words if x and _RELEASE_WORDS.match(x))
            return version, build or None
    for part in reversed(parents[0].parts):
        m = _JDK_DIR.search(part)
        if m:
            return m[1], f"version from the folder name {part}"
    return None, None


# --- CPython ------------------------------------------------------------------------------------
def describe_python_version(hexversion: int) -> str:
    """PY_VERSION_HEX as people write it: 0x030b02f0 -> 3.11.2."""
    return f"{(hexversion >> 24) & 0xFF}.{(hexversion >> 16) & 0xFF}.{(hexversion >> 8) & 0xFF}"


def cpython_version(binary: Path) -> str | None:
    """CPython's exact version from the Py_Version every 3.11+ build exports (its PY_VERSION_HEX),
    looked up in the file's GNU hash table (6 ms for python3.11; a walk of its 2,208 dynamic symbols
    takes 200), or None (before 3.11, or unreadable): the file's name then says 3.X."""
    try:
        with open(binary, "rb") as f:
            elf = open_elf(f)
            table = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
            sym = table.get_symbol("Py_Version") if table is not None and hasattr(table, "get_symbol") else None
            raw = _read_vaddr(elf, sym["st_value"], 4) if sym is not None else None
    except Exception:  # noqa: BLE001  (the target's executable: a corrupt or hostile file raises anything)
        return None
    return describe_python_version(int.from_bytes(raw, "little")) if raw and len(raw) == 4 else None


# --- Node ---------------------------------------------------------------------------------------
NODE_SCAN_BYTES = 128 << 20  # Node 20's .rodata is ~20 MB, its whole binary ~100 MB (file pages, not copied)


def node_versions(binary: Path) -> tuple[str | None, str | None]:
    """(Node's version, V8's version) from the strings compiled into the node binary or libnode:
    read from its .rodata (~20 MB for Node 20, a regular-expression pass of some 30 ms)."""
    try:
        with open(binary, "rb") as f:
            try:
                rodata = open_elf(f).get_section_by_name(".rodata")
            except Exception:  # noqa: BLE001  (a corrupt or hostile file raises anything)
                return None, None
            start, size = (rodata["sh_offset"], rodata["sh_size"]) if rodata is not None else (0, 0)
            with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as data:
                # searched in place, not copied (a copy of a whole file a target chose: any size),
                # and no further than NODE_SCAN_BYTES
                end = min(len(data), (start + size) if size else len(data), start + NODE_SCAN_BYTES)
                node = _NODE_RELEASE.search(data, start, end)
                v8 = _V8_VERSION.search(data, start, end)
                return (node[1].decode() if node else None), (v8[1].decode() if v8 else None)
    except (OSError, ValueError):
        return None, None


# --- Go -------------------------------------------------------------------------------------------
def read_go_build(exe: Path) -> GoBuild | None:
    """The build info of a Go executable, or None (not Go, unreadable, or no build info)."""
    try:
        with open(exe, "rb") as f:
            elf = open_elf(f)
            blob = _buildinfo_blob(elf)
            return parse_go_buildinfo(blob, lambda addr, n: _read_vaddr(elf, addr, n)) if blob else None
    except Exception:  # noqa: BLE001  (OSError, or a corrupt or hostile file's anything: not read)
        return None


def _buildinfo_blob(elf: ELFFile) -> bytes | None:
    """The first 64 KiB where the build info lives: its own section, else the first writable segment."""
    section = elf.get_section_by_name(".go.buildinfo")
    if section is not None:  # its first 64 KiB, not the size its header claims
        elf.stream.seek(section["sh_offset"])
        return elf.stream.read(min(section["sh_size"], 64 << 10))
    for seg in segment_headers(elf):
        if seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 0x3 == 0x2:  # PF_W without PF_X
            return segment_bytes(elf, seg, 64 << 10)
    return None


def _read_vaddr(elf: ELFFile, addr: int, size: int) -> bytes | None:
    for seg in segment_headers(elf):
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= addr and addr + size <= seg["p_vaddr"] + seg["p_filesz"]:
            elf.stream.seek(seg["p_offset"] + addr - seg["p_vaddr"])
            return elf.stream.read(size)
    return None


def parse_go_buildinfo(data: bytes, read=None) -> GoBuild | None:
    """The build info blob (cmd/link's buildinfo, read as Go's debug/buildinfo does): the magic at
    a 16-byte boundary, pointer size and flags; Go 1.18+ (flag 2) inlines the version and module
    info as length-prefixed strings, older linkers point at Go strings (read(addr, n) reads them)."""
    at = data.find(_GO_MAGIC)
    while at >= 0 and at % _BUILDINFO_ALIGN:
        at = data.find(_GO_MAGIC, at + 1)
    if at < 0 or len(data) - at < _BUILDINFO_HEADER:
        return None
    head = data[at:]
    ptr_size, flags = head[14], head[15]
    if flags & 2:
        version, rest = _uvarint_bytes(head, _BUILDINFO_HEADER)
        mod, _ = _uvarint_bytes(head, rest)
    elif read is not None and ptr_size in (4, 8) and not flags & 1:
        fmt = "<I" if ptr_size == 4 else "<Q"
        version = _go_string(read, struct.unpack_from(fmt, head, 16)[0], ptr_size)
        mod = _go_string(read, struct.unpack_from(fmt, head, 16 + ptr_size)[0], ptr_size)
    else:
        return None
    if not version:
        return None
    return GoBuild(version=version.decode(errors="replace"), main_module=_main_module(mod or b""))


def _uvarint_bytes(data: bytes, at: int) -> tuple[bytes | None, int]:
    length, shift = 0, 0
    while at < len(data):
        b = data[at]
        at += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            end = at + length
            return (data[at:end] if end <= len(data) else None), end
    return None, at


def _go_string(read, addr: int, ptr_size: int) -> bytes | None:
    """A Go string header (pointer, length) at addr, and the bytes it points at."""
    header = read(addr, 2 * ptr_size)
    if not header:
        return None
    fmt = "<II" if ptr_size == 4 else "<QQ"
    ptr, length = struct.unpack(fmt, header)
    return read(ptr, length) if 0 < length < (1 << 20) else None


def _main_module(mod: bytes) -> str | None:
    """The main package's path from the module info (`path\tgithub.com/x/y` line)."""
    if len(mod) >= 33 and mod[-17] == ord("\n"):
        mod = mod[16:-16]  # cmd/go's sentinels around the module info
    for line in mod.decode(errors="replace").splitlines():
        key, _, value = line.partition("\t")
        if key == "path" and value:
            return value.strip()
    return None
