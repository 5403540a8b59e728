"""The report's stacks as pprof profiles (diagnose/render/pprof.py), read back by Debian's
`go tool pprof` and, independently, by the protobuf library with pprof's own profile.proto."""

from __future__ import annotations

import gzip
import re
import subprocess
from pathlib import Path

import pytest
from kit import GO_ENV
from memdiag.diagnose.outfiles import open_report_folder
from memdiag.diagnose.render import render_all
from memdiag.diagnose.render.pprof import NAME_MAX, render_pprof
from memdiag.diagnose.render.pprof_proto.profile_pb2 import Profile
from memdiag.diagnose.report import Report, StackReport
from test_render import T0, fixture_report

MiB = 1 << 20
HOSTILE = "evil%s%n{0}\x1b[31m\u202e" + "x" * 5000  # format strings, ESC, a bidi override, huge


def leak_report() -> Report:
    """Three memleak stacks (process_order the heaviest, under malloc), two of page faults, and the
    flame graph's folded lines of memleak, as a diagnosis assembles them."""
    native = [
        (["malloc+0x0 [libc.so.6]", "process_order+0x12 [orderd]", "serve+0x40 [orderd]", "main+0x10 [orderd]"],
         ["allocator", "culprit", "caller", "caller"], 48 * MiB, 12288),
        (["calloc+0x0 [libc.so.6]", "parse_header+0x9 [orderd]", "serve+0x20 [orderd]", "main+0x10 [orderd]"],
         ["allocator", "culprit", "caller", "caller"], 3 * MiB, 96),
        (["malloc+0x0 [libc.so.6]", f"{HOSTILE}+0x1 [orderd]", "main+0x10 [orderd]"],
         ["allocator", "culprit", "caller"], 1 * MiB, 7),
    ]  # fmt: skip
    stacks = [
        StackReport(probe="memleak", frames=f, frame_kinds=k, bytes=b, count=n, detail=f"{n:,} allocations outstanding")
        for f, k, b, n in native
    ] + [
        StackReport(
            probe="faults",
            frames=["memset+0x20 [libc.so.6]", "main.fill (fill.go:31, inlined) [orderd]", "main+0x10 [orderd]"],
            bytes=40 * 4096,
            count=40,
            detail="40 page faults",
        ),
        StackReport(
            probe="jfr",
            frames=["Thumbnails.thumbnail(int) line: 31", "Thumbnails.main(java.lang.String[]) line: 12"],
            bytes=6 * MiB,
            count=17,
            detail="byte[] allocated during the recording; 17 sampled objects still held",
        ),
    ]
    folded = [
        f"main;serve;process_order;malloc {48 * MiB}",
        f"main;serve;parse_header;calloc {3 * MiB}",
        f"main;{HOSTILE.replace(' ', '_')};malloc {MiB}",
    ]
    return fixture_report().model_copy(update={"stacks": stacks, "folded": folded, "folded_probe": "memleak"})


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """The report's files written as `memdiag --pid` writes them (outfiles.ReportFolder)."""
    with open_report_folder(tmp_path / "report", "--output") as folder:
        folder.write(render_all(leak_report()))
    return tmp_path / "report"


def pprof(*args: str) -> str:
    out = subprocess.run(["go", "tool", "pprof", *args], env=GO_ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def top_rows(text: str) -> list[tuple[str, str]]:
    """(flat, function) of `go tool pprof -top`'s rows, heaviest first."""
    return re.findall(r"^ *(\S+) +\S+% +\S+% +\S+ +\S+% +(.+)$", text, re.M)


def decode(path: Path) -> Profile:
    return Profile.FromString(gzip.decompress(path.read_bytes()))


def test_go_tool_pprof_puts_the_culprit_on_top_with_its_bytes(written):
    rows = top_rows(pprof("-top", str(written / "profile.pb.gz")))
    assert rows[0] == ("48MB", "process_order"), rows  # malloc left out: it is in the allocator label
    assert "Type: inuse_space" in pprof("-top", str(written / "profile.pb.gz"))
    listed = written / "profile.memleak.pb.gz"
    assert top_rows(pprof("-top", "-sample_index=inuse_space", str(listed)))[0] == ("48MB", "process_order")
    assert top_rows(pprof("-top", "-sample_index=inuse_objects", str(listed)))[0] == ("12288", "process_order")
    faults = pprof("-top", "-sample_index=faults", str(written / "profile.faults.pb.gz"))
    assert top_rows(faults)[0] == ("40", "memset"), faults  # memset is no allocator: the fault's own frame
    raw = pprof("-raw", str(written / "profile.faults.pb.gz"))
    assert re.search(r"main\.fill fill\.go:31", raw), raw  # the Go frame's file:line kept as the location's line


def test_the_profiles_decode_with_pprofs_own_proto_and_say_what_they_hold(written):
    report = leak_report()
    files = sorted(p.name for p in written.glob("*.pb.gz"))
    assert files == ["profile.faults.pb.gz", "profile.jfr.pb.gz", "profile.memleak.pb.gz", "profile.pb.gz"]
    for name, types in [
        ("profile.pb.gz", [("inuse_space", "bytes")]),
        ("profile.memleak.pb.gz", [("inuse_space", "bytes"), ("inuse_objects", "count")]),
        ("profile.faults.pb.gz", [("space", "bytes"), ("faults", "count")]),
        ("profile.jfr.pb.gz", [("alloc_space", "bytes"), ("held_samples", "count")]),
    ]:
        p = decode(written / name)
        s = p.string_table
        assert s[0] == ""
        assert [(s[t.type], s[t.unit]) for t in p.sample_type] == types, name
        assert s[p.default_sample_type] == types[0][0]
        assert (p.time_nanos, p.duration_nanos, p.period) == (int(T0 * 1e9), 30 * 10**9, 1)
        assert [s[c] for c in p.comment][1:] == ["target: PID 123 (orderd)", "verdict: growth"]
        assert s[p.comment[0]].startswith("memdiag 0.1.0: ")
        fns = [(s[f.name], s[f.filename]) for f in p.function]
        assert len(fns) == len(set(fns)), fns  # each function once
        assert len({(loc.mapping_id, loc.line[0].function_id, loc.line[0].line) for loc in p.location}) == len(
            p.location
        )
    memleak = decode(written / "profile.memleak.pb.gz")
    s = memleak.string_table
    name = {f.id: s[f.name] for f in memleak.function}
    loc = {lo.id: name[lo.line[0].function_id] for lo in memleak.location}
    first = memleak.sample[0]
    assert [loc[i] for i in first.location_id] == ["process_order", "serve", "main"]  # the leaf first
    assert list(first.value) == [48 * MiB, 12288]
    labels = {s[lb.key]: s[lb.str] for lb in first.label}
    assert labels == {"allocator": "malloc", "detail": "12,288 allocations outstanding"}
    assert [s[m.filename] for m in memleak.mapping][0] == "orderd"  # the program's own: pprof's main binary
    jfr = decode(written / "profile.jfr.pb.gz")
    name = {f.id: jfr.string_table[f.name] for f in jfr.function}
    lines = [(name[lo.line[0].function_id], lo.line[0].line) for lo in jfr.location]
    assert lines == [("Thumbnails.thumbnail(int)", 31), ("Thumbnails.main(java.lang.String[])", 12)]  # Java's lines
    assert sum(v.value[0] for v in decode(written / "profile.pb.gz").sample) == sum(s.bytes for s in report.stacks[:3])


def test_a_hostile_frame_name_is_kept_as_data_escaped_and_bounded(written):
    for name in ("profile.pb.gz", "profile.memleak.pb.gz"):
        p = decode(written / name)
        evil = [p.string_table[f.name] for f in p.function if p.string_table[f.name].startswith("evil")]
        assert len(evil) == 1, name
        assert evil[0].startswith("evil%s%n{0}\\x1b[31m\\u202exxx"), evil  # ESC and the bidi override escaped
        assert len(evil[0]) == NAME_MAX and evil[0].endswith("…")
    rows = top_rows(pprof("-top", str(written / "profile.memleak.pb.gz")))
    assert rows[2][1].startswith("evil%s%n{0}\\x1b[31m"), rows  # pprof prints it as it is, escapes and all


def test_a_report_without_stacks_has_an_empty_profile_and_no_probe_profiles():
    files = render_all(fixture_report().model_copy(update={"stacks": [], "folded": []}))
    assert [n for n in files if n.endswith(".pb.gz")] == ["profile.pb.gz"]
    p = Profile.FromString(gzip.decompress(files["profile.pb.gz"]))  # type: ignore[arg-type]
    assert (len(p.sample), p.string_table[p.comment[0]]) == (0, "memdiag 0.1.0: no stacks recorded")


def test_a_frame_name_that_is_no_utf8_becomes_a_replacement_character():
    """A name read as bytes and kept with its undecodable bytes as surrogates (report.json refuses
    those; a profile must hold valid UTF-8 too)."""
    report = leak_report()
    stack = report.stacks[0].model_copy(
        update={"frames": ["caf\udce9+0x1 [orderd]", "main+0x10 [orderd]"], "frame_kinds": ["culprit", "caller"]}
    )
    files = render_pprof(report.model_copy(update={"stacks": [stack], "folded": ["main;caf\udce9 5"]}))
    for name in ("profile.pb.gz", "profile.memleak.pb.gz"):
        p = Profile.FromString(gzip.decompress(files[name]))
        assert "caf\ufffd" in [p.string_table[f.name] for f in p.function], name


def test_a_probe_name_that_is_no_plain_word_names_no_file():
    """A report read back from JSON says what it says: its probe names become no path."""
    report = leak_report()
    odd = report.stacks[0].model_copy(update={"probe": "../../etc/x"})
    files = render_pprof(report.model_copy(update={"stacks": [odd, *report.stacks]}))
    assert sorted(files) == ["profile.faults.pb.gz", "profile.jfr.pb.gz", "profile.memleak.pb.gz", "profile.pb.gz"]


def test_a_line_of_thousands_of_digits_is_no_line():
    """A file name is the binary's: `x.go:` and 5,000 digits is no line (int() refuses past 4,300)."""
    from memdiag.diagnose.render.pprof import _frame

    fn, file, line, mod = _frame("main.f (x.go:" + "9" * 5000 + ") [prog]")
    assert line is None and mod == "prog"
    assert _frame("main.f (x.go:12) [prog]") == ("main.f", "x.go", 12, "prog")
