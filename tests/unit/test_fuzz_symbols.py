"""Property-based fuzzing (hypothesis) of the parsers of symbolization inputs a target controls
(issue 42, item 6): perf maps (PerfMap.from_bytes, parse_perf_map), /proc/PID/maps (parse_maps), and
ELF files (every reader of probes/elf.py, Go's function table, runtime recognition) on mutated bytes
of a real library and of a generated one. For every input: no exception out of the reader, each
example within a time bound (an alarm that the readers' own `except Exception` cannot swallow), the
results within their stated bounds, and the process's peak memory within a bound over the run."""

from __future__ import annotations

import contextlib
import signal
import struct
from contextlib import contextmanager
from pathlib import Path

import pytest
from elfgen import shared_object
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memdiag.probes import elf as elfmod
from memdiag.probes import symtab
from memdiag.probes.elf import passing_elf_info
from memdiag.probes.go.pclntab import PclntabError, go_table
from memdiag.probes.mapping import MAX_CODE_MAPPINGS, MAX_DATA_MAPPINGS, parse_maps
from memdiag.system.perfmap import MAX_LINES, MAX_NAME, PerfMap, parse_perf_map
from memdiag.system.runtime import cpython_version, read_go_build

EXAMPLE_S = 5  # one input's bound (most take milliseconds; a loop over a lying count takes forever)
EXAMPLE_MIB = 64  # what one example may add to the process's peak RSS
PEAK_GROWTH_MIB = 128  # what the whole run may add to the process's peak RSS (a lying size read whole: GiBs)
REAL = Path("/usr/lib/x86_64-linux-gnu/libBrokenLocale.so.1")  # glibc's smallest library: 15 KB, real headers
FUZZ = settings(
    deadline=None,  # the alarm bounds each example; a loaded CI host must not fail on hypothesis' 200 ms
    derandomize=True,  # the same inputs in CI as here
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
INTERESTING = [0, 1, 7, 24, 64, 0xFFFF, 0x10000, 2**31 - 1, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1]
# section types as lies: symbol and string tables, NOBITS, hash tables (parsed whole by pyelftools), notes
SECTION_TYPES = [1, 2, 3, 4, 5, 7, 8, 9, 11, 0x6FFFFFF6, 0x6FFFFFFF]


class Hung(BaseException):
    """An example past EXAMPLE_S: a BaseException, so no reader's `except Exception` hides it."""


@contextmanager
def bounded():
    """One example: within EXAMPLE_S, and adding at most EXAMPLE_MIB to the process's peak RSS."""

    def alarm(_signum, _frame):
        raise Hung(f"an example took more than {EXAMPLE_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, EXAMPLE_S)
    before = _peak_mib()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert _peak_mib() - before < EXAMPLE_MIB


def _peak_mib() -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM"))
    return int(line.split()[1]) / 1024


@pytest.fixture(scope="module")
def peak():
    """The process's peak RSS may grow by PEAK_GROWTH_MIB over the module's examples at most."""
    before = _peak_mib()
    yield
    assert _peak_mib() - before < PEAK_GROWTH_MIB


# --- perf maps -------------------------------------------------------------------------------------
hexnum = st.integers(0, 2**70).map(lambda n: f"{n:x}") | st.text("0123456789abcdefABCDEFx", max_size=20)
name = st.text(max_size=40) | st.builds(lambda c, n: c * n, st.characters(), st.integers(0, 3000))
line = st.builds(lambda a, b, n, px: f"{px}{a} {px}{b} {n}", hexnum, hexnum, name, st.sampled_from(["", "0x"]))
perf_text = st.lists(line | st.text(max_size=30), max_size=60).map("\n".join)


@FUZZ
@given(text=perf_text, raw=st.binary(max_size=2000), probes=st.lists(st.integers(0, 2**64 - 1), max_size=8))
def test_perf_maps_of_any_bytes_parse_within_their_bounds(peak, text, raw, probes):
    with bounded():
        for data in (text.encode(errors="surrogatepass"), raw):
            pm = PerfMap.from_bytes("/tmp/perf-1.map", data, len(data), False)
            assert pm.count <= MAX_LINES and list(pm.starts) == sorted(pm.starts)
            for s in pm.symbols:
                assert len(s.name.encode(errors="surrogatepass")) <= 4 * MAX_NAME + 3
                s.function()
            for a in [*probes, *pm.starts[:4]]:
                hit = pm.lookup(a)
                assert hit is None or hit.start <= a < hit.start + hit.size
        for s in parse_perf_map(text):
            assert 0 <= s.start < 2**64 and len(s.name) <= MAX_NAME + 1
        PerfMap("/tmp/perf-1.map", parse_perf_map(text), len(text), False).lookup(probes[0] if probes else 0)


# --- /proc/PID/maps ----------------------------------------------------------------------------------
field = st.text(max_size=12) | st.integers(-5, 2**70).map(lambda n: f"{n:x}")
maps_line = st.builds(
    lambda lo, hi, perms, off, dev, ino, path: f"{lo}-{hi} {perms} {off} {dev} {ino} {path}",
    field,
    field,
    st.sampled_from(["r-xp", "rw-p", "---p", "", "rwxs"]) | st.text(max_size=5),
    field,
    st.builds(lambda a, b: f"{a}:{b}", field, field) | st.text(max_size=6),
    st.integers(-1, 2**70).map(str) | st.text(max_size=5),
    st.sampled_from(["", "/usr/lib/libc.so.6", "[heap]", "/x (deleted)", " (deleted)"]) | st.text(max_size=30),
)


@FUZZ
@given(lines=st.lists(maps_line | st.text(max_size=60), max_size=40))
def test_maps_of_any_text_parse_within_their_bounds(peak, lines):
    with bounded():
        maps = parse_maps("\n".join(lines))
        assert len(maps) <= MAX_CODE_MAPPINGS + MAX_DATA_MAPPINGS and len(maps) <= len(lines)
        assert [m.start for m in maps] == sorted(m.start for m in maps)
        for m in maps:
            assert m.is_file == m.path.startswith("/") and not m.path.endswith(" (deleted)")


# --- ELF -------------------------------------------------------------------------------------------
BASES = {"generated": shared_object(12), "real": REAL.read_bytes() if REAL.exists() else shared_object(3)}


@st.composite
def mutated_elf(draw) -> bytes:
    data = bytearray(BASES[draw(st.sampled_from(sorted(BASES)))])
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count = struct.unpack_from("<HH", data, 0x3A)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["header", "section field", "bytes", "noise over section headers"]))
        if kind == "header":  # e_shoff, e_phoff, e_shnum, e_shstrndx, e_phnum ... as lies
            at, width = draw(st.sampled_from([(0x20, 8), (0x28, 8), (0x38, 2), (0x3C, 2), (0x3E, 2), (0x36, 2)]))
            value = draw(st.sampled_from(INTERESTING) | st.integers(0, 2 ** (8 * width) - 1)) % 2 ** (8 * width)
            data[at : at + width] = value.to_bytes(width, "little")
        elif kind == "section field" and count:  # sh_name, sh_type, sh_offset, sh_size, sh_link, sh_entsize
            i = draw(st.integers(0, count - 1))
            off, width = draw(st.sampled_from([(0, 4), (4, 4), (0x18, 8), (0x20, 8), (0x28, 4), (0x38, 8)]))
            choices = st.sampled_from(SECTION_TYPES) if off == 4 else st.sampled_from(INTERESTING)
            value = draw(choices | st.integers(0, 2 ** (8 * width) - 1)) % 2 ** (8 * width)
            at = shoff + i * entsize + off
            if at + width <= len(data):
                data[at : at + width] = value.to_bytes(width, "little")
        elif kind == "bytes":
            at = draw(st.integers(0, len(data) - 1))
            data[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
        else:
            noise = draw(st.binary(min_size=16, max_size=64))
            for k in range(shoff, min(len(data), shoff + entsize * count)):
                data[k] = noise[k % len(noise)]
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


def _exercise(path: str) -> None:
    """Every reader of one module a diagnosis may call, on the file at path: none may raise."""
    info = passing_elf_info(path)
    if info is not None:
        try:
            symbols = info.symbols()
            assert len(symbols) <= symtab.MAX_SYMBOLS
            for vaddr in [0, 0x1000, 0x1010, *(s.address + 1 for s in symbols[:3])]:
                info.lookup(vaddr)
                info.object_at(vaddr)
                info.section_of(vaddr)
                info.cfi_row(vaddr)
                info.read_at(vaddr, 16)
                info.file_offset(vaddr)
            info.symbol_named("f000000000001", exported_only=True)
            info.build_id()
            info.debug_file()
            info.plt_slots()
            info.got_slots()
            info.loads_and_tls()
            info.tls_object_at(0)
        finally:
            info.close()
    with contextlib.suppress(PclntabError):  # not a Go file: its one answer
        go_table(path)
    read_go_build(Path(path))
    cpython_version(Path(path))


@settings(FUZZ, max_examples=300)
@given(data=mutated_elf())
def test_elf_readers_on_mutated_files_degrade_to_no_symbols(peak, tmp_path, data):
    path = tmp_path / "mutated.so"
    path.write_bytes(data)
    with bounded():
        _exercise(str(path))
    assert len(elfmod.NOTES) <= elfmod.MAX_NOTES
    elfmod.NOTES.clear()


def test_the_fuzz_alarm_is_not_swallowed_by_a_readers_own_catch():
    """A hang inside a module's parse must fail the fuzz, not become that module's note."""
    with pytest.raises(Hung), bounded():
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            while True:
                pass
        except Exception:  # what the readers' boundary catches
            pass
