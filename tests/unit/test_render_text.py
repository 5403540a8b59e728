"""Unicode's format characters (bidi overrides and isolates, zero-width ones, tags) from a target's
comm, command line or symbols reach no report file as they are: every format shows them escaped, as
it shows control characters, and report.json keeps the same values."""

from __future__ import annotations

import gzip
import json
import re
import sys
import unicodedata

from memdiag.diagnose.render import render_all
from memdiag.diagnose.render.pprof_proto.profile_pb2 import Profile
from memdiag.diagnose.render.probe_text import render_probe
from memdiag.diagnose.render.text import FORMAT_CHARS, json_text, plain
from memdiag.diagnose.report import Report
from test_render import fixture_report

RLO, LRI, PDI, ZWSP, TAG = "\u202e", "\u2066", "\u2069", "\u200b", "\U000e0041"
HOSTILE = f"ok{RLO}txt.exe{LRI}x{PDI}{ZWSP}\u200f\u00ad{TAG}"


def _format_chars(text: str) -> list[str]:
    return sorted({f"U+{ord(c):04X}" for c in text if unicodedata.category(c) == "Cf"})


def test_the_format_class_is_every_cf_character_of_this_python():
    cf = {c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c) == "Cf"}
    ours = set(filter(re.compile(f"[{FORMAT_CHARS}]").fullmatch, map(chr, range(sys.maxunicode + 1))))
    assert ours == cf, (unicodedata.unidata_version, sorted(map(hex, map(ord, ours ^ cf))))


def test_plain_and_json_text_escape_bidi_and_format_characters():
    assert plain(HOSTILE) == "ok\\u202etxt.exe\\u2066x\\u2069\\u200b\\u200f\\xad\\U000e0041"
    raw = json.dumps({"comm": HOSTILE}, ensure_ascii=False)
    safe = json_text(raw)
    assert _format_chars(safe) == []
    assert '"ok\\u202etxt.exe\\u2066x\\u2069\\u200b\\u200f\\u00ad\\udb40\\udc41"' in safe
    assert json.loads(safe) == {"comm": HOSTILE}  # the same value


def test_every_report_file_shows_a_hostile_comm_argv_and_frame_escaped():
    base = fixture_report()
    target = base.target.model_copy(
        update={"comm": HOSTILE, "cmdline": ["/usr/bin/orderd", HOSTILE], "description": f"PID 123 ({HOSTILE})"}
    )
    stack = [*base.verdict.culprit.stack]
    stack[1] = f"order_alloc{RLO}+0x12 [orderd]"
    culprit = base.verdict.culprit.model_copy(update={"comm": HOSTILE, "stack": stack})
    verdict = base.verdict.model_copy(update={"culprit": culprit})
    report = base.model_copy(
        update={"target": target, "verdict": verdict, "folded": [f"main;order_alloc{RLO};malloc 4096"]}
    )
    files = render_all(report)
    assert set(files) >= {"report.md", "report.json", "report.html", "growth.svg", "growth.folded"}
    strings = {}
    for name, text in files.items():
        if name == "growth.folded":  # data for other tools, one stack a line, as recorded
            continue
        if isinstance(text, bytes):  # a pprof profile: its strings
            text = strings[name] = "\n".join(Profile.FromString(gzip.decompress(text)).string_table)
        assert _format_chars(text) == [], name
    assert "order_alloc\\u202e" in strings["profile.pb.gz"]
    assert "target: PID 123 (ok\\u202etxt.exe\\u2066x" in strings["profile.memleak.pb.gz"]
    assert "ok\\u202etxt.exe\\u2066x" in files["report.md"]
    assert "ok\\u202etxt.exe\\u2066x" in files["report.html"]
    assert "order_alloc\\u202e" in files["growth.svg"]
    back = Report.model_validate_json(files["report.json"])
    assert back.target.comm == HOSTILE and back.target.cmdline[1] == HOSTILE  # the data as it was


def test_probe_text_escapes_a_bidi_comm():
    from memdiag.probes.faults import FaultsResult, ProcessFaults

    r = FaultsResult(
        name="faults",
        status="ok",
        target=f"PID 7 ({HOSTILE})",
        per_process=[ProcessFaults(pid=7, comm=HOSTILE, faults=3, bytes=12288)],
    )
    text = render_probe(r)
    assert _format_chars(text) == [] and "ok\\u202etxt.exe" in text


def test_a_target_s_name_with_a_newline_stays_one_line_in_a_rule_s_text_and_a_table():
    """A file or process name is the target's: a newline in it would start a heading of its own in
    report.md, from a rule's summary or from a table's cell."""
    from memdiag.diagnose.render.mdtable import table
    from memdiag.rules.engine import render

    name = "/dev/shm/a\n\n## Verdict (healthy)\n"
    said = render("files named {shm.top_pattern} grow", {"shm.top_pattern": name})
    assert "\n" not in said and "\\n\\n## Verdict" in said
    rows = table(["pattern", "files"], [[name, "3"]])
    assert len(rows) == 3 and all("\n" not in r for r in rows)
