"""Source lines of native frames from DWARF line tables (probes/lines.py), in the function that holds
the address (where a call was inlined there, that call's line), checked against an independent
reader (LLVM's addr2line -i where installed, else binutils'), on a -g binary of the kit
and on glibc through its debug file (libc6-dbg, found by build id); and the bounds that hold
whatever a binary's DWARF claims (a compressed section claiming or unpacking past its bound)."""

from __future__ import annotations

import random
import shutil
import struct
import subprocess
import time
import zlib
from pathlib import Path

import pytest
from kit import build
from memdiag.probes import elf as elfmod
from memdiag.probes import lines
from memdiag.probes.elf import elf_info, forget

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"


def _addr2line(path: str, addresses: list[int]) -> list[tuple[str, str]]:
    """(file's last component, line) of each address in the function that holds it, as an addr2line
    other than memdiag's says (the last of its -i lines: where the function calls what was inlined
    there; "??" where it has none). binutils' 2.40 names a DWARF 5 unit's own file for its headers'
    lines (its file 1 read as file 0's): with it, only lines are compared."""
    tool = shutil.which("llvm-addr2line") or "addr2line"
    out = subprocess.run([tool, "-a", "-i", "-e", path, *map(hex, addresses)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    groups: list[list[str]] = []
    for text in out.stdout.splitlines():
        if text.startswith("0x"):
            groups.append([])
        elif text:
            groups[-1].append(text)
    said = []
    for group in groups:
        where = group[-1].split(" ")[0]
        file, _, line = where.rpartition(":")
        said.append(("??", "??") if file.startswith("??") or line in ("0", "?") else (file.rsplit("/", 1)[-1], line))
    return said


def _compare(elf, module: str, debug: str, addresses: list[int]) -> int:
    table = elf.lines(module)
    assert table is not None
    llvm = shutil.which("llvm-addr2line") is not None
    agree = 0
    for address, (file, line) in zip(addresses, _addr2line(debug, addresses), strict=True):
        mine = table.source(address)
        got = (mine[0], str(mine[1])) if mine else ("??", "??")
        assert (got if llvm else got[1]) == ((file, line) if llvm else line), hex(address)
        agree += got != ("??", "??")
    return agree


def test_a_g_binary_s_lines_are_the_ones_addr2line_reads(notes):
    path = str(build("orderd", ["-O2"]))
    elf = elf_info(path)
    addresses = [a for s in elf.symbols() for a in range(s.address, s.address + s.size)]
    assert _compare(elf, path, path, addresses) > 500
    clone = next(s for s in elf.symbols() if s.name.startswith("process_order.") and not s.name.endswith(".cold"))
    leak = next(i for i, text in enumerate(Path(lines.__file__).parents[1].joinpath("tests/workloads/orderd.c")
                .read_text().splitlines(), 1) if "/* LEAK */" in text)  # fmt: skip
    # the call to malloc in the clone: its return address less one is on the line that leaks
    code = elf.read_at(clone.address, clone.size)
    calls = [i for i in range(len(code) - 5) if code[i] == 0xE8]
    assert any(elf.lines(path).source(clone.address + i + 4) == ("orderd.c", leak) for i in calls)
    assert not notes


@pytest.mark.skipif(elf_info(LIBC) is None or elf_info(LIBC).debug_file() is None, reason="no glibc debug file")
def test_glibc_s_lines_come_from_its_debug_file_found_by_build_id(notes):
    libc = elf_info(LIBC)
    debug = libc.debug_file()
    assert libc.elf.get_section_by_name(".debug_line") is None  # the library carries none itself
    t = time.monotonic()
    malloc = libc.symbol_named("malloc")
    assert libc.lines(LIBC).source(malloc.address)[0] == "malloc.c"
    first = time.monotonic() - t
    random.seed(48)
    functions = [s for s in libc.symbols() if s.size][::40]
    addresses = sorted(s.address + random.randrange(s.size) for s in functions)
    assert _compare(libc, LIBC, debug.path, addresses) > len(addresses) // 2
    assert first < 5.0, f"glibc's line table took {first:.2f} s to first answer"
    assert lines._HELD[0] > 1 << 20  # its sections, unpacked
    lines.close_all()  # what a probe does once its stacks have their lines
    assert lines._HELD[0] == 0
    assert libc.lines(LIBC).source(malloc.address)[0] == "malloc.c"  # read again where asked again
    assert not notes


def _with_section(src: Path, out: Path, name: bytes, payload: bytes, flags_or: int = 0) -> None:
    """A copy of src whose section `name` is payload (appended at the file's end) and flags_or set."""
    data = bytearray(src.read_bytes())
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    strtab_off = struct.unpack_from("<Q", data, shoff + shstrndx * shentsize + 0x18)[0]
    at = len(data)
    data += payload
    for i in range(shnum):
        hdr = shoff + i * shentsize
        name_at = strtab_off + struct.unpack_from("<I", data, hdr)[0]
        if bytes(data[name_at : name_at + len(name) + 1]) == name + b"\0":
            flags = struct.unpack_from("<Q", data, hdr + 8)[0] | flags_or
            struct.pack_into("<Q", data, hdr + 8, flags)
            struct.pack_into("<QQ", data, hdr + 0x18, at, len(payload))
            out.write_bytes(bytes(data))
            return
    raise AssertionError(f"no {name!r} section")


def test_a_compressed_debug_section_is_unpacked_no_further_than_its_bound(tmp_path, notes):
    src = build("orderd", ["-O2"])
    bomb = zlib.compress(b"\0" * (lines.MAX_SECTION_BYTES + (1 << 20)), 9)  # ~65 MiB from ~65 KiB
    cases = {
        "unpacks": (struct.pack("<IIQQ", 1, 0, 4096, 1) + bomb, "unpacking past the 4,096 bytes it claims"),
        "at-bound": (struct.pack("<IIQQ", 1, 0, lines.MAX_SECTION_BYTES, 1) + bomb, "unpacking past the 67,108,864"),
        "claims": (struct.pack("<IIQQ", 1, 0, 1 << 40, 1) + zlib.compress(b"\0" * 64), "(memdiag reads 64 MiB)"),
    }
    for kind, (payload, why) in cases.items():
        path = tmp_path / f"{kind}-orderd"
        _with_section(src, path, b".debug_line", payload, lines.SHF_COMPRESSED)
        t = time.monotonic()
        elf = elf_info(str(path))
        assert elf.lines(str(path)) is None
        assert time.monotonic() - t < 5.0
        said = notes.pop(str(path))
        assert said.startswith("no source lines") and why in said, said
    assert lines._HELD[0] == 0  # nothing of them held


def test_a_debuglink_leading_out_of_the_debug_folder_is_not_followed(tmp_path, notes, monkeypatch):
    src = build("orderd", ["-O2"])
    stripped = tmp_path / "orderd"
    subprocess.run(["objcopy", "--strip-debug", "--add-gnu-debuglink=" + str(src), str(src), str(stripped)], check=True)
    elf = elf_info(str(stripped))
    assert lines.debuglink(elf.elf)[0] == "orderd"
    # its debug file where the debuglink says, under a debug folder of the test's
    root = tmp_path / "debug"
    (root / "srv").mkdir(parents=True)
    shutil.copy(src, root / "srv" / "orderd")
    monkeypatch.setattr(elfmod, "DEBUG_ROOT", str(root))
    monkeypatch.setattr(elfmod.ElfInfo, "debug_file", lambda self: None)  # the build id does not find it
    assert elf.lines("/srv/orderd").source(elf.symbol_named("main").address) is not None
    forget()
    elf = elf_info(str(stripped))
    assert elf.lines("/srv/../../orderd") is None  # DEBUG_ROOT/srv/../.. is outside it


def test_a_sibling_link_pointing_back_does_not_loop(tmp_path):
    """A subprogram's DW_AT_sibling pointing at itself (a hostile binary's): pyelftools follows it
    wherever it points, the same entry for ever; the walk stops there, the line still read."""
    from elftools.elf.elffile import ELFFile

    src = build("orderd", ["-O2"])
    path = tmp_path / "orderd"
    data = bytearray(src.read_bytes())
    with open(src, "rb") as f:
        elf = ELFFile(f)
        base = elf.get_section_by_name(".debug_info")["sh_offset"]
        patched = False
        for cu in elf.get_dwarf_info().iter_CUs():
            for die in cu.iter_DIEs():
                link = die.attributes.get("DW_AT_sibling")
                if die.tag == "DW_TAG_subprogram" and link is not None and link.form == "DW_FORM_ref4":
                    struct.pack_into("<I", data, base + link.offset, die.offset - cu.cu_offset)
                    patched = True
                    break
            if patched:
                break
    assert patched
    path.write_bytes(bytes(data))
    e = elf_info(str(path))
    t = time.monotonic()
    where = e.lines(str(path)).source(e.symbol_named("main").address + 8)
    assert time.monotonic() - t < 5.0
    assert where is not None and where[0] == "orderd.c", where
    forget()
