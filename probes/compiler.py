"""bpf/<name>.c to bytecode, once per kernel, source and options: bcc compiles it in a child
process and the result (bytecode with map references, map specs, key and value types) is kept in
a cache that probes.bpfobj loads from. The diagnosing process never maps LLVM: bcc's compiler
peaks at 130-170 MiB per program (measured on 6.18), more than memdiag's whole footprint should
be, and it is paid once per kernel instead of once per probe run (2 s of CPU each).

bcc, not clang + libbpf: tracepoint context structs come from the running kernel's tracefs
formats at compile time, which is what makes one program right on kernels whose headers are
missing or wrong (this project's 6.18 test kernel compiles against 6.1 headers)."""

from __future__ import annotations

import atexit
import contextlib
import ctypes as ct
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from importlib.resources import files
from pathlib import Path

from memdiag.system import arch

from . import kernel

CACHE = Path(os.environ.get("MEMDIAG_BPF_CACHE", "/var/lib/memdiag/bpf"))
FORMAT = 1  # bump when the cached layout changes
_LOCK = threading.Lock()  # one compiling child at a time: a probe waits for the warm-up's child


class CompileError(Exception):
    """bcc could not compile or load a program; the message carries its last words."""


class CompilerUnavailable(CompileError):
    """Nothing to compile with here (no root, no headers, no bcc); the reason says which."""


def source(name: str) -> Path:
    """Absolute path of bpf/<name>.c in the installed package."""
    return Path(str(files("memdiag.bpf").joinpath(f"{name}.c")))


# Shared BPF text with map calls in it: bcc rewrites those in the main file only, so a program's
# `#include "NAME"` line of one of these is replaced by the file's text before bcc sees it.
SPLICED = ("pynow.h",)


def program_text(name: str) -> str:
    """bpf/<name>.c as bcc compiles it: each include of a SPLICED file replaced by that file's text."""
    src = source(name)
    out = []
    for line in src.read_text().splitlines(keepends=True):
        spliced = next((f for f in SPLICED if line.strip() == f'#include "{f}"'), None)
        out.append((src.parent / spliced).read_text() if spliced else line)
    return "".join(out)


def sha256():
    """A SHA-256 digest, as hashlib.sha256() gives it, from CPython's own implementation where it
    has one: hashlib maps OpenSSL's libcrypto, 3.5 MiB of memdiag's resident memory measured here,
    for the cache keys alone (the digest is the same, so are the keys)."""
    try:
        from _sha2 import sha256 as digest  # CPython 3.12 and later
    except ImportError:
        try:
            from _sha256 import sha256 as digest  # CPython 3.10 and 3.11
        except ImportError:
            from hashlib import sha256 as digest
    return digest()


def _defines_text(defines: dict[str, int | str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(defines.items()))


def cache_key(name: str, defines: dict[str, int | str]) -> str:
    """What the bytecode depends on: the sources, the options, the kernel (its tracepoint formats
    and headers), and the compiler."""
    h = sha256()
    src = source(name)
    for part in (src, *sorted(src.parent.glob("*.h"))):  # the shared headers it may include
        h.update(part.read_bytes())
    uname = os.uname()
    h.update(f"{FORMAT}|{_defines_text(defines)}|{uname.release}|{uname.version}|{uname.machine}".encode())
    # the header tree bcc compiles against (prepare_bcc_environment exports this same path)
    h.update(str(os.environ.get("BCC_KERNEL_SOURCE") or kernel.kernel_headers()).encode())
    for lib in (f"{folder}/libbcc.so.0" for folder in arch.LIB_DIRS):
        with contextlib.suppress(OSError):
            st = os.stat(lib)
            h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
    return f"{name}-{h.hexdigest()[:20]}"


_private: list[Path] = []


def cache_dir() -> Path:
    """The cache, if only its owner (us) can write it: what is loaded from it runs in the kernel.
    Otherwise a private folder for this process, removed when it exits."""
    try:
        CACHE.mkdir(parents=True, exist_ok=True, mode=0o755)
        if _owned_and_closed(CACHE):
            return CACHE
    except OSError:
        pass
    if not _private:
        private = Path(tempfile.mkdtemp(prefix="memdiag-bpf-"))
        atexit.register(shutil.rmtree, private, ignore_errors=True)
        _private.append(private)
    return _private[0]


def _owned_and_closed(path: Path) -> bool:
    st = path.stat()
    return st.st_uid == os.geteuid() and not st.st_mode & 0o022


def cached(name: str, defines: dict[str, int | str]) -> dict | None:
    try:
        return json.loads((cache_dir() / f"{cache_key(name, defines)}.json").read_text())
    except (OSError, ValueError):
        return None


def compile_many(requests: list[tuple[str, dict[str, int | str]]], timeout: float = 120) -> None:
    """Compile the programs not yet cached, one child process each: compiles in one process add
    up (15 programs in one child peaked at 253 MiB, one alone at ~170 MiB), and a probe waiting
    for its program waits for one compile at most, not for a whole batch."""
    for name, defines in requests:
        with _LOCK:
            if cached(name, defines) is None:
                _compile_one(name, defines, timeout)


def _compile_one(name: str, defines: dict[str, int | str], timeout: float) -> None:
    ready = kernel.prepare_bcc_environment()  # headers and tracefs, inherited by the child
    if not ready.available:
        raise CompilerUnavailable(ready.reason)
    job = {"name": name, "defines": defines, "out": str(cache_dir() / f"{cache_key(name, defines)}.json")}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "memdiag.probes.compiler"],
            input=json.dumps([job]),
            capture_output=True,
            text=True,
            timeout=timeout,
            # Out of the terminal's process group: a Ctrl-C is memdiag's to handle (it finishes what it
            # loads, then stops cleanly), not a kill of the compiler under it.
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        raise CompileError(f"compiling {name}.c took over {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise CompileError(" / ".join(lines[-4:]) or f"the compiler exited with {proc.returncode}")


def compiled(name: str, defines: dict[str, int | str]) -> dict:
    """The compiled form of bpf/<name>.c with these options, compiling it when not cached."""
    found = cached(name, defines)
    if found is None:
        compile_many([(name, defines)])
        found = cached(name, defines)
        if found is None:
            raise CompileError(f"{name}: compiled, but the result could not be read back from {cache_dir()}")
    return found


def _compile(job: dict) -> dict:
    """In the child: compile with bcc and describe what came out."""
    from bcc import BPF, lib  # noqa: PLC0415  (only the child ever imports bcc)

    lib.bpf_num_tables.restype = ct.c_ulonglong
    lib.bpf_num_tables.argtypes = [ct.c_void_p]
    lib.bpf_table_name.restype = ct.c_char_p
    lib.bpf_table_name.argtypes = [ct.c_void_p, ct.c_ulonglong]
    for fn in ("bpf_table_key_size_id", "bpf_table_leaf_size_id"):
        getattr(lib, fn).restype = ct.c_size_t
        getattr(lib, fn).argtypes = [ct.c_void_p, ct.c_ulonglong]
    lib.bpf_table_fd_id.restype = ct.c_int
    lib.bpf_table_fd_id.argtypes = [ct.c_void_p, ct.c_ulonglong]

    src = source(job["name"])
    defines = job["defines"]
    cflags = [f"-I{src.parent}", *(f"-D{k}={v}" for k, v in defines.items()), "-Wno-macro-redefined"]
    # bcc would attach TRACEPOINT_PROBEs on construction; the child only wants the bytecode.
    BPF._trace_autoload = lambda self: None
    b = BPF(text=program_text(job["name"]).encode(), cflags=cflags)
    try:
        m = b.module
        functions = {}
        for i in range(lib.bpf_num_functions(m)):
            fname = lib.bpf_function_name(m, i)
            start, size = lib.bpf_function_start(m, fname), lib.bpf_function_size(m, fname)
            functions[fname.decode()] = ct.string_at(start, size).hex()
        maps = []
        for i in range(lib.bpf_num_tables(m)):
            tname = lib.bpf_table_name(m, i)
            maps.append(
                {
                    "name": tname.decode(),
                    "fd": lib.bpf_table_fd_id(m, i),
                    "type": lib.bpf_table_type_id(m, i),
                    "key_size": lib.bpf_table_key_size_id(m, i),
                    "leaf_size": lib.bpf_table_leaf_size_id(m, i),
                    "max_entries": lib.bpf_table_max_entries_id(m, i),
                    "flags": lib.bpf_table_flags_id(m, i),
                    "key_desc": json.loads(lib.bpf_table_key_desc(m, tname).decode() or '"int"'),
                    "leaf_desc": json.loads(lib.bpf_table_leaf_desc(m, tname).decode() or '"int"'),
                }
            )
            if maps[-1]["type"] == 4:  # BPF_PERF_EVENT_ARRAY: its "leaf" is the struct perf_submit sends
                from bcc.table import _get_event_class  # noqa: PLC0415

                # bcc exits on a struct inside a struct; such a probe declares its event type itself
                with contextlib.suppress(Exception, SystemExit):
                    maps[-1]["leaf_desc"] = _desc_of(_get_event_class(b[tname]))
        return {
            "name": job["name"],
            "defines": defines,
            "license": (lib.bpf_module_license(m) or b"GPL").decode(),
            "kern_version": lib.bpf_module_kern_version(m),
            "functions": functions,
            "maps": maps,
        }
    finally:
        b.cleanup()


def _desc_of(t) -> str | list:
    """The JSON type description (as bpfobj.ctype_of reads it) of a ctypes type."""
    if issubclass(t, ct.Array):
        raise TypeError("arrays are described by their field")
    if issubclass(t, (ct.Structure, ct.Union)):
        fields = []
        for f in t._fields_:
            name, ft = f[0], f[1]
            if issubclass(ft, ct.Array):
                fields.append([name, _desc_of(ft._type_), [ft._length_]])
            elif len(f) == 3:
                fields.append([name, _desc_of(ft), f[2]])
            else:
                fields.append([name, _desc_of(ft)])
        return [t.__name__, fields, "union" if issubclass(t, ct.Union) else "struct"]
    names = {
        ct.c_bool: "_Bool", ct.c_char: "char", ct.c_byte: "signed char", ct.c_ubyte: "unsigned char",
        ct.c_short: "short", ct.c_ushort: "unsigned short", ct.c_int: "int", ct.c_uint: "unsigned int",
        ct.c_long: "long", ct.c_ulong: "unsigned long", ct.c_longlong: "long long",
        ct.c_ulonglong: "unsigned long long", ct.c_void_p: "void *", ct.c_char_p: "char *",
        ct.c_float: "float", ct.c_double: "double",
    }  # fmt: skip
    return names[t]


def main() -> int:
    jobs = json.loads(sys.stdin.read())
    for job in jobs:
        try:
            result = _compile(job)
        except Exception as e:  # bcc raises bare Exception; its own diagnostics went to stderr already
            print(f"{job['name']}.c: {e}", file=sys.stderr)
            return 1
        out = Path(job["out"])
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out)  # concurrent compiles of the same program: last one wins, both whole
    return 0


if __name__ == "__main__":
    sys.exit(main())
