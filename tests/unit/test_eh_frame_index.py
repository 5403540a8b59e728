"""The unwinder finds FDEs through .eh_frame_hdr's sorted table and parses one at a time; the
rows it gets must be those of a full parse of .eh_frame, on the machine's own libc."""

import random
import subprocess
from pathlib import Path

from elftools.dwarf.callframe import FDE
from memdiag.probes.elf import ElfInfo

# the libc this test runs on, wherever the distro keeps it
LIBC = next(ln.split()[-1] for ln in Path("/proc/self/maps").read_text().splitlines() if "/libc.so" in ln)


def _full_parse(info: ElfInfo) -> list[FDE]:
    return [e for e in info.elf.get_dwarf_info().EH_CFI_entries() if isinstance(e, FDE)]


def test_rows_through_the_index_match_a_full_parse():
    path = LIBC
    info = ElfInfo(path)
    assert info.elf.get_section_by_name(".eh_frame_hdr") is not None
    fdes = _full_parse(ElfInfo(path))
    assert len(fdes) > 1000
    rng = random.Random(7)
    checked = 0
    for fde in rng.sample(fdes, 200):
        lo, size = fde.header["initial_location"], fde.header["address_range"]
        table = fde.get_decoded().table
        if not table:
            continue
        pc = lo + rng.randrange(max(size, 1))
        expected = [r for r in table if r["pc"] <= pc][-1]
        row = info.cfi_row(pc)
        assert row is not None and row["pc"] == expected["pc"]
        assert (row["cfa"].reg, row["cfa"].offset) == (expected["cfa"].reg, expected["cfa"].offset)
        checked += 1
    assert checked > 150
    assert info.cfi_row(0) is None  # below every FDE


def test_a_file_without_eh_frame_hdr_is_parsed_whole(tmp_path):
    src = tmp_path / "f.c"
    src.write_text("int f(int x) { return x * 3; }\nint main(void) { return f(2); }\n")
    exe = tmp_path / "f"
    # -Wl,--no-eh-frame-hdr: the linker writes .eh_frame but not its index
    subprocess.run(["gcc", "-O1", "-Wl,--no-eh-frame-hdr", "-o", str(exe), str(src)], check=True)
    info = ElfInfo(str(exe))
    assert info.elf.get_section_by_name(".eh_frame_hdr") is None
    f = next(s for s in info.symbols() if s.name == "f")
    assert info.cfi_row(f.address) is not None
