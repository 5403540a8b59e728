"""Hostile symbolization inputs, on planted files (issue 42): perf maps that are links, FIFOs, another
user's, or huge; ELF files whose headers lie or are noise; /proc/PID/maps with 300,000 mappings.
Each is refused or bounded, with a stated cost: memory is measured in a child process (its peak
RSS before and after the read), so one test's garbage does not count in another's."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

from elfgen import FUNC_BYTES, TEXT_AT, debug_at, shared_object
from memdiag.probes import elf as elfmod
from memdiag.probes import symtab
from memdiag.probes.elf import elf_info, passing_elf_info
from memdiag.probes.mapping import MAX_CODE_MAPPINGS, MAX_DATA_MAPPINGS, parse_maps
from memdiag.system import perfmap
from memdiag.system.perfmap import MAX_LINES, MAX_NAME, read_perf_map

MiB = 1 << 20
MARKER = "MARKER-1234-HOSTSECRET"
BOUND = elfmod.BOUND_NOTE
TESTS = Path(__file__).resolve().parents[1]


def _fake_proc(tmp: Path, pid: int = 4242, uid: int | None = None) -> Path:
    """A /proc of one process whose root is a folder here: its status (its effective uid: ours
    unless told) and its root's /tmp."""
    uid = os.geteuid() if uid is None else uid
    proc = tmp / "proc"
    (proc / str(pid) / "root" / "tmp").mkdir(parents=True)
    ids = "\t".join([str(uid)] * 4)
    (proc / str(pid) / "status").write_text(f"Name:\tnode\nPid:\t{pid}\nUid:\t{ids}\nNSpid:\t{pid}\n")
    return proc


def _path(p: Path) -> str:
    return f"__import__('pathlib').Path({str(p)!r})"


def _measured(code: str) -> dict:
    """Run `code` in a child that imports memdiag (and numpy) first; it sets `out` (a dict). Its RSS
    peak over the code's run (the peak after minus before, MiB) is added as `peak_mib`."""
    prog = (
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(TESTS)!r})\n"
        "import memdiag.probes.elf, memdiag.probes.procmaps, memdiag.system.perfmap, numpy\n"
        # VmHWM, not ru_maxrss: that one is kept across execve, the parent's (pytest's) peak
        "rss = lambda: int(next(x for x in open('/proc/self/status') if x.startswith('VmHWM')).split()[1]) / 1024\n"
        "before, t = rss(), time.monotonic()\n"
        "out = {}\n" + code + "\n"
        "out.update(peak_mib=rss() - before, seconds=time.monotonic() - t)\n"
        "print(json.dumps(out))\n"
    )
    r = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.splitlines()[-1])


# --- perf maps -----------------------------------------------------------------------------------
def test_a_perf_map_linked_to_a_host_file_is_refused(tmp_path):
    proc = _fake_proc(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text(f"7f0000001000 40 {MARKER}\n")
    own = proc / "4242" / "root" / "tmp" / "perf-4242.map"
    own.symlink_to(secret)  # absolute: the kernel would resolve it against memdiag's root
    assert read_perf_map(4242, proc) is None
    own.unlink()
    own.symlink_to("../etc/perf")  # inside the root, still a link: not the runtime's own file
    (proc / "4242" / "root" / "etc").mkdir()
    (proc / "4242" / "root" / "etc" / "perf").write_text(f"7f0000001000 40 {MARKER}\n")
    assert read_perf_map(4242, proc) is None
    own.unlink()
    own.write_text("7f0000001000 40 JS:*f /x.js:2:3\n")  # the control: the runtime's own file is read
    assert read_perf_map(4242, proc).lookup(0x7F0000001001).function() == ("f", "x.js:2")


def test_a_perf_map_of_another_owner_is_refused(tmp_path):
    """A host process's /tmp is everyone's: a map planted under its name by another user is not its."""
    other = os.geteuid() + 1000
    proc = _fake_proc(tmp_path, uid=other)
    own = proc / "4242" / "root" / "tmp" / "perf-4242.map"
    own.write_text("7f0000001000 40 JS:*f /x.js:2:3\n")  # ours, not the target's (uid `other`)
    assert read_perf_map(4242, proc) is None
    status = proc / "4242" / "status"
    status.write_text(status.read_text().replace(str(other), str(os.geteuid())))
    assert read_perf_map(4242, proc).lookup(0x7F0000001000).name == "JS:*f /x.js:2:3"


def test_a_fifo_as_the_perf_map_returns_at_once(tmp_path):
    """In a child: before, open() blocked for good (a regression fails by timeout, not a hang)."""
    proc = _fake_proc(tmp_path)
    os.mkfifo(proc / "4242" / "root" / "tmp" / "perf-4242.map")
    got = _measured(f"out['map'] = repr(memdiag.system.perfmap.read_perf_map(4242, {_path(proc)}))")
    assert got["map"] == "None" and got["seconds"] < 1


def test_a_huge_perf_map_costs_a_bounded_memory_and_keeps_its_newest_lines(tmp_path):
    """1 GiB (sparse but for its last 24 MiB): before, 560 MiB of peak RSS and 2 s; the newest
    MAX_BYTES and MAX_LINES are read now."""
    proc = _fake_proc(tmp_path)
    path = proc / "4242" / "root" / "tmp" / "perf-4242.map"
    lines = 1_100_000  # of ~23 bytes: 24 MiB, more lines than MAX_LINES in the last MAX_BYTES
    with open(path, "wb") as f:
        f.truncate((1 << 30) - 24 * MiB)
        f.seek(0, os.SEEK_END)
        f.write(b"".join(b"7f%010x 10 JS:*f%07d\n" % (i * 16, i) for i in range(lines)))
    code = (
        f"pm = memdiag.system.perfmap.read_perf_map(4242, {_path(proc)})\n"
        f"newest = pm.lookup(0x7f0000000000 + {(lines - 1) * 16}).name\n"
        "out.update(count=pm.count, truncated=pm.truncated, newest=newest, oldest=repr(pm.lookup(0x7f0000000000)))"
    )
    got = _measured(code)
    assert got["count"] == MAX_LINES and got["truncated"]
    assert got["newest"] == f"JS:*f{lines - 1:07d}" and got["oldest"] == "None"
    assert got["peak_mib"] < 64 and got["seconds"] < 5, got  # measured here: +27 MiB, 0.2 s


def test_a_perf_map_name_is_cut_at_its_bound(tmp_path):
    proc = _fake_proc(tmp_path)
    (proc / "4242" / "root" / "tmp" / "perf-4242.map").write_bytes(b"1000 10 " + b"A" * MiB + b"\n2000 10 ok\n")
    pm = read_perf_map(4242, proc)
    assert pm.lookup(0x1000).name == "A" * MAX_NAME + "…" and pm.lookup(0x2000).name == "ok"
    assert len(perfmap.parse_perf_map("1000 10 " + "B" * 5000)[0].name) == MAX_NAME + 1


# --- ELF -------------------------------------------------------------------------------------------
def _noise_over_section_headers(data: bytearray, seed: int) -> bytearray:
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count = struct.unpack_from("<HH", data, 0x3A)
    noise = random.Random(seed)
    for i in range(shoff, min(len(data), shoff + entsize * count)):
        data[i] = noise.randrange(256)
    return data


def test_a_library_with_random_section_headers_has_no_symbols_and_says_so(tmp_path, notes):
    """libc's own bytes, its section headers overwritten: before, `ValueError: cannot fit 'int' into
    an offset-sized integer` ended the diagnosis."""
    path = tmp_path / "libc-corrupt.so.6"
    libc = Path("/usr/lib/x86_64-linux-gnu/libc.so.6")
    path.write_bytes(_noise_over_section_headers(bytearray(libc.read_bytes()), 42))
    info = elf_info(str(path))
    assert info is None or (info.symbols() == [] and info.lookup(0x1000) is None)
    assert list(notes) == [str(path)] and notes[str(path)].startswith("no symbols ("), notes
    why = notes[str(path)]
    assert elfmod.take_notes() == [f"{path}: {why}"] and not elfmod.NOTES  # taken once, for one trail


def test_a_mapped_data_file_that_is_no_elf_file_is_no_corrupt_module(tmp_path, notes):
    """A locale archive or gconv's cache, mapped by every glibc program: no symbols and nothing to
    say of it (the trail named both on every diagnosis, and a test saw two probe lines too many)."""
    data = tmp_path / "LC_CTYPE"
    data.write_bytes(b"\x00" * 4096)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert elf_info(str(data)) is None and elf_info(str(empty)) is None
    assert not notes
    bad = tmp_path / "bad.so"  # the magic of an ELF file, then nothing: a corrupt module, said
    bad.write_bytes(b"\x7fELF" + b"\xff" * 60)
    assert elf_info(str(bad)) is None and list(notes) == [str(bad)]


def test_a_symbol_table_that_claims_more_than_the_file_holds_reads_what_is_there(tmp_path, notes):
    data = bytearray(shared_object(10))
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    struct.pack_into("<Q", data, shoff + 2 * 64 + 0x20, 24 << 55)  # .symtab's sh_size: 864 PiB of rows
    path = tmp_path / "liar.so"
    path.write_bytes(data)
    info = passing_elf_info(str(path))
    assert [s.name for s in info.symbols()][:2] == ["f000000000001", "f000000000002"]
    assert info.lookup(TEXT_AT + FUNC_BYTES * 9 + 1)[0].name == "f000000000010"
    assert not notes
    # a size no table can have (not a whole number of rows): the module has no symbols, and says so
    struct.pack_into("<Q", data, shoff + 2 * 64 + 0x20, (24 << 55) + 1)
    path.write_bytes(data)
    liar = passing_elf_info(str(path))
    assert liar.symbols() == [] and liar.lookup(TEXT_AT) is None
    why = "Expected section size to be a multiple of entry size in section '.symtab'"
    assert notes == {str(path): f"no symbols (load_symbols: ELFError: {why})"}


def test_a_section_count_past_sixteen_bits_is_refused_at_once(tmp_path, notes):
    """e_shnum 0 says: the count is section 0's sh_size, here 2^40 (a loop over them never ends)."""
    data = bytearray(shared_object(3))
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    struct.pack_into("<H", data, 0x3C, 0)
    struct.pack_into("<Q", data, shoff + 0x20, 1 << 40)
    path = tmp_path / "many.so"
    path.write_bytes(data)
    assert passing_elf_info(str(path)) is None
    assert "claims 1099511627776 sections" in notes[str(path)]


def test_a_symbol_table_past_the_bound_keeps_its_first_functions_in_bounded_memory(tmp_path):
    """Before: 2,000,000 symbols cost 518 MiB of peak RSS and 4.4 s. MAX_SYMBOLS are kept now, in
    arrays (SymbolTable)."""
    path = tmp_path / "huge.so"
    path.write_bytes(shared_object(symtab.MAX_SYMBOLS + 50_000))
    code = (
        f"info = memdiag.probes.elf.passing_elf_info({str(path)!r})\n"
        "out.update(kept=len(info._table()), notes=memdiag.probes.elf.take_notes(),"
        f" first=info.lookup({TEXT_AT + 5})[0].name)"
    )
    got = _measured(code)
    assert got["kept"] == symtab.MAX_SYMBOLS and got["first"] == "f000000000001"
    assert got["notes"] == [f"{path}: {BOUND}"]
    assert got["peak_mib"] < 80 and got["seconds"] < 10, got  # measured here: +46 MiB, 0.3 s


def test_every_symbol_naming_one_huge_string_costs_its_bound_of_names(tmp_path):
    """50,000 symbols all named by one 4 MiB string with no end: before, each symbol decoded the
    string again to the end of the table (50,000 copies: 200 GiB). Now a name is cut at
    MAX_SYMBOL_NAME and the names kept stop at MAX_NAME_CHARS."""
    path = tmp_path / "one-name.so"
    path.write_bytes(shared_object(50_000, shared_name=4 * MiB))
    code = (
        f"info = memdiag.probes.elf.passing_elf_info({str(path)!r})\n"
        f"out.update(kept=len(info._table()), longest=len(info.lookup({TEXT_AT})[0].name),"
        " notes=memdiag.probes.elf.take_notes())"
    )
    got = _measured(code)
    assert got["longest"] == symtab.MAX_SYMBOL_NAME + 1  # cut, and marked so
    assert 0 < got["kept"] <= symtab.MAX_NAME_CHARS // symtab.MAX_SYMBOL_NAME
    assert got["notes"] == [f"{path}: {BOUND}"]
    assert got["peak_mib"] < 80 and got["seconds"] < 10, got  # measured here: +38 MiB, 0.05 s


def test_unwinding_through_a_library_reads_its_eh_frame_not_its_debug_info(tmp_path):
    """A library whose .debug_info claims 1 GiB (sparse): before, one unwinding rule looked up in it
    read every .debug_* section whole (pyelftools' get_dwarf_info): 2 GiB of peak RSS and 3.3 s."""
    path = tmp_path / "debug.so"
    data = shared_object(10, debug_info=1 << 30)
    path.write_bytes(data)
    os.truncate(path, debug_at(len(data)) + (1 << 30))
    code = (
        f"info = memdiag.probes.elf.passing_elf_info({str(path)!r})\n"
        f"out.update(row=repr(info.cfi_row({TEXT_AT + 4})), name=info.lookup({TEXT_AT + 4})[0].name)"
    )
    got = _measured(code)
    assert got["row"] == "None" and got["name"] == "f000000000001"  # no .eh_frame: no rule, and its names
    assert got["peak_mib"] < 16 and got["seconds"] < 2, got


def test_a_hash_section_whose_counts_do_not_fit_is_refused_before_pyelftools_parses_it(tmp_path):
    """nbucket 2^32 - 16 in a 64 MiB sparse file: pyelftools parsed its arrays up to the file's end
    (3.3 s, +128 MiB; a 1 GiB file, 16 times that). Built where a hash section is named or linked."""

    data = bytearray(shared_object(10))
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    hashed = shoff + 3 * 64  # .strtab made a SHT_HASH linked to .symtab, .symtab's names in .shstrtab
    struct.pack_into("<I", data, hashed + 4, 5)
    struct.pack_into("<I", data, hashed + 0x28, 2)
    struct.pack_into("<I", data, shoff + 2 * 64 + 0x28, 4)
    (at,) = struct.unpack_from("<Q", data, hashed + 0x18)
    struct.pack_into("<Q", data, hashed + 0x20, 1 << 40)
    struct.pack_into("<II", data, at, 0xFFFFFFF0, 0)
    path = tmp_path / "hash.so"
    path.write_bytes(data)
    os.truncate(path, 64 * MiB)
    code = (
        f"f = open({str(path)!r}, 'rb')\n"
        "try:\n    memdiag.system.elfread.open_elf(f).get_section(3)\n"
        "except Exception as e:\n    out['refused'] = str(e)\n"
    )
    got = _measured("import memdiag.system.elfread\n" + code)
    assert got["refused"] == "SHT_HASH section claims 17179869128 bytes in 67104344"
    assert got["peak_mib"] < 8 and got["seconds"] < 1, got


# --- /proc/PID/maps --------------------------------------------------------------------------------
def test_300000_mappings_keep_code_and_files_first_in_bounded_memory(tmp_path):
    """Before: 300,000 mappings cost 159 MiB of peak RSS here (299 MB in the attack). Anonymous data
    mappings are kept up to their bound; code and files after them still are."""
    lines = [f"{0x10000000 + i * 0x2000:x}-{0x10001000 + i * 0x2000:x} rw-p 00000000 00:00 0" for i in range(240_000)]
    code_at = 0x7F0000000000
    lines += [
        f"{code_at + i * 0x2000:x}-{code_at + 0x1000 + i * 0x2000:x} r-xp 00000000 08:01 {100 + i % 7} /lib/l{i % 7}.so"
        for i in range(60_000)
    ]
    proc = tmp_path / "proc"
    (proc / "4242" / "root").mkdir(parents=True)
    (proc / "4242" / "maps").write_text("\n".join(lines) + "\n")
    code = (
        f"s = memdiag.probes.procmaps.AddressSpace.of(4242, __import__('pathlib').Path({str(proc)!r}))\n"
        "out.update(kept=len(s.mappings), code=sum(m.is_file for m in s.mappings),"
        " found=s.find(0x7f0000000000 + 59_999 * 0x2000).path, notes=memdiag.probes.elf.take_notes())"
    )
    got = _measured(code)
    assert got["kept"] == MAX_DATA_MAPPINGS + 60_000 and got["code"] == 60_000 and got["found"] == "/lib/l2.so"
    dropped = 240_000 - MAX_DATA_MAPPINGS
    assert got["notes"] == [
        f"/proc/4242/maps: {dropped:,} mappings not kept (past {MAX_CODE_MAPPINGS:,} of code and files and "
        f"{MAX_DATA_MAPPINGS:,} of anonymous data): their addresses stay unknown"
    ]
    assert got["peak_mib"] < 60 and got["seconds"] < 5, got  # measured here: +23 MiB, 0.5 s


def test_maps_lines_the_kernel_never_writes_are_skipped():
    text = "zz-10 r-xp 0 08:01 5 /a\n1000-2000 r-xp 0 zz:01 5 /b\n1000 r-xp 0 08:01 5 /c\n3000-4000 r--p 0 08:01 7 /d\n"
    assert [m.path for m in parse_maps(text)] == ["/d"]
    anonymous = "\n".join(f"{i:x}-{i + 1:x} rw-p 0 00:00 0" for i in range(MAX_DATA_MAPPINGS + 5))
    many = parse_maps(anonymous)
    assert len(many) == MAX_DATA_MAPPINGS and many.dropped == 5
    assert len(parse_maps(anonymous, bounded=False)) == MAX_DATA_MAPPINGS + 5  # the reachability scan's


def test_the_trail_says_which_module_had_no_symbols_after_the_probe_that_found_it(notes):
    """What a probe's symbolization noted goes in the diagnosis's trail, after that probe's line."""
    from memdiag.diagnose.engine import Engine
    from memdiag.diagnose.workflow import load_rules
    from memdiag.probes.registry import REGISTRY
    from memdiag.system.target import Target

    def run(name, ctx):
        elfmod.note_module("/srv/lib/libx.so", "no symbols (its headers: ValueError: cannot fit 'int')")
        return REGISTRY.face(name).result(name=name, status="ok", duration_s=ctx.seconds)

    now = [1000.0]
    e = Engine(load_rules(), Target(kind="system"), 30.0, 2.0, clock=lambda: now[0], runner=run)
    e.run_requests([("faults", 5.0, "rss-climbing")])
    steps = [(t.name, t.state, t.reason) for t in e.trail if t.kind == "probe"]
    assert steps == [
        ("faults", "ok", "asked by rss-climbing; ok"),
        ("faults", "no-symbols", "/srv/lib/libx.so: no symbols (its headers: ValueError: cannot fit 'int')"),
    ]
    assert not notes  # taken: the next probe's trail does not repeat it


def test_every_modules_tables_together_stay_within_their_bound_and_are_given_back(tmp_path, notes, monkeypatch):
    """A target mapping many large libraries: the tables held in all stop at MAX_HELD_BYTES (here
    made 1 MiB), the module past it keeps what fitted and says so; a module's reader let go gives
    its share back."""
    import gc

    gc.collect()
    start = symtab._HELD[0]  # tables other tests of this run still hold (a module cache beside elf_info's)
    monkeypatch.setattr(symtab, "MAX_HELD_BYTES", start + (1 << 20))  # 1 MiB more than those
    paths = []
    for i in range(3):
        paths.append(tmp_path / f"lib{i}.so")
        paths[-1].write_bytes(shared_object(12_000))
    first, second = passing_elf_info(str(paths[0])), passing_elf_info(str(paths[1]))
    assert len(first.symbols()) == 12_000 and not notes
    assert 0 < len(second.symbols()) < 12_000 and notes == {str(paths[1]): elfmod.BOUND_NOTE}
    assert symtab._HELD[0] - start <= 1 << 20
    first.close()
    second.close()
    del first, second
    gc.collect()
    assert symtab._HELD[0] == start
    third = passing_elf_info(str(paths[2]))
    assert len(third.symbols()) == 12_000
    third.close()
