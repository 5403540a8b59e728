"""Runtime recognition on fixture trees (a /proc/PID with maps, root/ and exe as the reader finds
them) and on build-info blobs laid out as Go's linker writes them: which runtime, its version,
and None where nothing says."""

from __future__ import annotations

import struct
from pathlib import Path

from memdiag.probes.registry import REGISTRY
from memdiag.system.runtime import parse_go_buildinfo, parse_jdk_release

MAGIC = b"\xff Go buildinf:"
# cmd/go's sentinels around the module info (modload.infoStart / infoEnd), 16 bytes each
START, END = bytes.fromhex("3077af0c9274080241e1c107e6d618e6"), bytes.fromhex("f932433186182072008242104116d8f2")


def _maps(*paths: str) -> str:
    lines = ["00400000-00452000 r--p 00000000 08:01 1 /usr/bin/app"]
    for n, path in enumerate(paths):
        start = 0x7F0000000000 + n * 0x100000
        lines.append(f"{start:x}-{start + 0x1000:x} r-xp 00001000 08:01 {n + 2} {path}")
    return "\n".join(lines) + "\n"


def _proc(tmp_path: Path, *paths: str, files: dict[str, str] | None = None) -> Path:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "maps").write_text(_maps(*paths))
    for rel, text in (files or {}).items():
        f = proc / "42" / "root" / rel.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return proc


def _uvarint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _blob(version: str, modinfo: str, pad: int = 0) -> bytes:
    """The Go 1.18+ layout: magic, pointer size 8, flags 2 (strings inline), 16 zero bytes, then
    the version and the framed module info as length-prefixed strings."""
    mod = START + modinfo.encode() + END
    head = MAGIC + bytes([8, 2]) + bytes(16)
    return bytes(pad) + head + _uvarint(len(version)) + version.encode() + _uvarint(len(mod)) + mod


def test_cpython_is_named_by_its_mapping(tmp_path):
    proc = _proc(tmp_path, "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/python3.11")
    r = REGISTRY.recognise(42, proc)
    assert (r.name, r.version, r.module) == ("cpython", "3.11", "/usr/bin/python3.11")
    assert r.describe() == "CPython 3.11 (/usr/bin/python3.11)"


def test_a_jvm_takes_its_version_from_the_jdks_release_file(tmp_path):
    home = "/usr/lib/jvm/java-17-openjdk-amd64"
    release = 'IMPLEMENTOR="Debian"\nJAVA_RUNTIME_VERSION="17.0.15+6-Debian-1deb12u1"\nJAVA_VERSION="17.0.15"\n'
    proc = _proc(tmp_path, f"{home}/lib/server/libjvm.so", files={f"{home}/release": release})
    r = REGISTRY.recognise(42, proc)
    assert (r.name, r.version, r.detail) == ("jvm", "17.0.15", "Debian 17.0.15+6-Debian-1deb12u1")
    assert r.describe() == f"JVM 17.0.15 ({home}/lib/server/libjvm.so; Debian 17.0.15+6-Debian-1deb12u1)"


def test_a_jdk8_layout_and_a_jdk_without_release_file(tmp_path):
    home = "/opt/jdk8"
    proc = _proc(
        tmp_path, f"{home}/jre/lib/amd64/server/libjvm.so", files={f"{home}/release": 'JAVA_VERSION="1.8.0_392"\n'}
    )
    assert REGISTRY.recognise(42, proc).version == "1.8.0_392"
    bare = _proc(tmp_path / "b", "/usr/lib/jvm/temurin-25-jdk-amd64/lib/server/libjvm.so")
    r = REGISTRY.recognise(42, bare)
    assert (r.version, r.detail) == ("25", "version from the folder name temurin-25-jdk-amd64")
    nowhere = _proc(tmp_path / "c", "/srv/app/libjvm.so")
    assert (REGISTRY.recognise(42, nowhere).name, REGISTRY.recognise(42, nowhere).version) == ("jvm", None)


def test_node_is_recognised_by_its_binary_or_libnode_even_unreadable(tmp_path):
    r = REGISTRY.recognise(42, _proc(tmp_path, "/usr/bin/node"))
    assert (r.name, r.version, r.module) == ("node", None, "/usr/bin/node")
    assert r.describe() == "Node.js (version unknown) (/usr/bin/node)"
    lib = REGISTRY.recognise(42, _proc(tmp_path / "b", "/usr/bin/nodejs", "/usr/lib/x86_64-linux-gnu/libnode.so.108"))
    assert lib.name == "node"


def test_native_code_and_a_gone_process_are_none(tmp_path):
    proc = _proc(tmp_path, "/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libssl.so.3")
    (proc / "42" / "exe").write_bytes(b"\x7fELF not really")
    assert REGISTRY.recognise(42, proc) is None
    assert REGISTRY.recognise(43, proc) is None


def test_go_build_info_inline_strings():
    modinfo = "path\texample.com/orders/cmd/orderd\nmod\texample.com/orders\tv1.2.3\th1:abc=\n"
    b = parse_go_buildinfo(_blob("go1.19.8", modinfo))
    assert (b.version, b.main_module) == ("go1.19.8", "example.com/orders/cmd/orderd")
    # the magic counts only at a 16-byte boundary, as the linker aligns it
    assert parse_go_buildinfo(bytes(3) + _blob("go1.19.8", modinfo)) is None
    assert parse_go_buildinfo(_blob("go1.21.0", "", pad=32)).version == "go1.21.0"
    assert parse_go_buildinfo(_blob("go1.21.0", "")).main_module is None
    assert parse_go_buildinfo(b"\0" * 64) is None


def test_go_build_info_pointers_before_go_1_18():
    """Go 1.13-1.17: two pointers to Go string headers (pointer, length) somewhere in the data."""
    memory = {0x5000: struct.pack("<QQ", 0x6000, 8), 0x6000: b"go1.16.3", 0x5100: struct.pack("<QQ", 0x6100, 0)}
    blob = MAGIC + bytes([8, 0]) + struct.pack("<QQ", 0x5000, 0x5100)

    def read(addr: int, n: int) -> bytes | None:
        raw = memory.get(addr)
        return raw[:n] if raw is not None and len(raw) >= n else None

    b = parse_go_buildinfo(blob, read)
    assert (b.version, b.main_module) == ("go1.16.3", None)
    assert parse_go_buildinfo(blob) is None  # nothing to follow the pointers with


def test_jdk_release_values_lose_their_quotes():
    assert parse_jdk_release('JAVA_VERSION="21.0.2"\nOS_NAME="Linux"\n') == {
        "JAVA_VERSION": "21.0.2",
        "OS_NAME": "Linux",
    }


def test_a_runtime_claims_its_mapped_files_by_their_names_alone():
    def claimed(path: str) -> list[str]:
        return [f.name for f in REGISTRY.runtime_faces() if f.claims(path)]

    assert claimed("/usr/bin/node") == ["node"] and claimed("/usr/lib/x86_64-linux-gnu/libnode.so.108") == ["node"]
    assert claimed("/usr/lib/libpython3.11.so.1.0") == ["cpython"] and claimed("/usr/bin/python3.11") == ["cpython"]
    assert claimed("/usr/lib/jvm/x/lib/server/libjvm.so") == ["jvm"]
    assert claimed("/usr/lib/x86_64-linux-gnu/libc.so.6") == [] and claimed("/usr/bin/prometheus") == []


def test_cpythons_exact_version_is_its_own_py_version(tmp_path):
    import os
    import platform
    import sys

    from memdiag.system.runtime import cpython_version

    # this interpreter's file (3.11+ exports Py_Version), and a running process's line
    assert cpython_version(Path(os.path.realpath(sys.executable))) == platform.python_version()
    assert REGISTRY.recognise(os.getpid()).version == platform.python_version()
    (tmp_path / "python3.12").write_bytes(b"\x7fELF not really")
    assert cpython_version(tmp_path / "python3.12") is None  # the name's 3.12 stands then
