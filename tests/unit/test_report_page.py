"""report.html as a real headless Chromium runs it (tests/browser.py): a real leak's report (a report.json
memdiag wrote diagnosing tests/workloads/leak.c, kept in golden/) loads with no error and fetches
nothing, its chart and flame graph are drawn, and searching the culprit highlights its frame; a
hostile frame name stays text. With MEMDIAG_REGEN_GOLDEN=1 it also writes docs/images/report.png."""

import json
import os
import re
from pathlib import Path

import pytest
from browser import HIGHLIGHTED, Browser
from memdiag.diagnose.render import render_all
from memdiag.diagnose.render.html import chart_data, flame_data, json_for_script, render_body
from memdiag.diagnose.report import Report
from test_render import fixture_report

GOLDEN = Path(__file__).parent / "golden"
SCREENSHOT = Path(__file__).parents[2] / "docs" / "images" / "report.png"
# The only URLs in the page: XML namespace names d3 and uPlot create elements in (never fetched) and
# the two libraries' homes in their licence comments.
NAMESPACES = {
    "http://www.w3.org/1999/xhtml",
    "http://www.w3.org/1999/xlink",
    "http://www.w3.org/2000/svg",
    "http://www.w3.org/2000/xmlns/",
    "http://www.w3.org/XML/1998/namespace",
    "https://d3js.org/d3-selection/",
    "https://github.com/leeoniya/uPlot",
}


def leak_report() -> Report:
    return Report.model_validate_json((GOLDEN / "report_leak.json").read_text())


def _page(report: Report, tmp_path: Path) -> Path:
    path = tmp_path / "report.html"
    path.write_text(render_all(report)["report.html"])
    return path


def test_a_real_leak_report_in_chromium(tmp_path):
    report = leak_report()
    culprit = report.verdict.culprit.function
    assert culprit == "leak_order_history"
    page = _page(report, tmp_path)
    with Browser(tmp_path / "profile") as b:
        b.open(page.as_uri())
        assert b.errors() == []
        assert b.requests() == [page.as_uri()]  # the page itself, nothing else
        assert b.eval("document.querySelector('#verdict').className") == "verdict k-leak"
        assert b.eval("document.querySelector('#culprit').textContent") == culprit
        # the chart: uPlot's canvas, the target's RSS and the culprit stack's outstanding bytes as lines
        assert b.eval("document.querySelector('#memory-chart canvas').width") > 500
        labels = b.eval("memdiag.chart.series.map(s => s.label)")
        assert labels[1] == "process RSS"
        assert "leak_order_history+0x1c [leak] outstanding (memleak)" in labels
        assert "ledger: anonymous memory" in labels
        # the flame graph: an SVG with a frame per function of growth.folded
        names = b.eval("[...document.querySelectorAll('#flame-graph svg g.frame')].map(g => g.getAttribute('name'))")
        assert {"all", "main", culprit, "malloc"} <= set(names)
        assert b.eval(HIGHLIGHTED) == []
        b.eval(f"memdiag.flame.search({json.dumps(culprit)})")
        assert b.eval(HIGHLIGHTED) == [culprit]
        assert b.eval("document.querySelector('#flame-details').textContent").startswith("search: 1 frame(s), 23.7 MiB")
        tip = b.eval(f"document.querySelector('#flame-graph g.frame[name={culprit}] title').textContent")
        assert tip == f"{culprit}: 23.7 MiB (100.0% of 23.7 MiB), in 1 stack", tip
        # the probes' timeline: memleak attached 9.9 s into the window, traced 12.0 s, its cost beside
        row = b.eval("[...document.querySelectorAll('#probe-timeline tr')][1].textContent")
        assert row.startswith("memleakok") and "attached 9.9 s, traced 12.0 s" in row and "0.324%" in row
        # the Markdown below, with its contents and the counters' all-zero rows folded
        assert b.eval("document.querySelector('#toc a[href=\"#system-counters\"]') !== null")
        folded = b.eval("[...document.querySelectorAll('details.quiet tr')].map(r => r.cells[0].textContent)")
        assert "SwapTotal" in folded and "pgscan_direct" in folded and "MemAvailable" not in folded
        assert b.errors() == []
        if os.environ.get("MEMDIAG_REGEN_GOLDEN") == "1":
            b.screenshot(SCREENSHOT, height=1700)


def test_a_hostile_frame_name_stays_text(tmp_path):
    hostile = "</script><img src=x onerror=document.title='pwned'><!--"
    base = fixture_report()
    culprit = base.verdict.culprit.model_copy(update={"function": hostile, "comm": hostile})
    report = base.model_copy(
        update={
            "verdict": base.verdict.model_copy(update={"culprit": culprit, "summary": hostile}),
            "folded": [f"main;{hostile};malloc 8388608", "main;Orders::add(long);malloc 25165824"],
        }
    )
    text = render_all(report)["report.html"]
    assert hostile not in text and "<img" not in text
    assert text.count("<script") == 5  # the data block and the four scripts, no more
    block = re.search(r'<script type="application/json" id="memdiag-data">(.*?)</script>', text, re.S)
    assert hostile in json.dumps(json.loads(block.group(1)))  # the same name, escaped only
    page = _page(report, tmp_path)
    with Browser(tmp_path / "profile") as b:
        b.open(page.as_uri())
        assert b.errors() == []
        assert b.eval("document.images.length") == 0 and b.eval("document.scripts.length") == 5
        assert b.eval("document.title") != "pwned"
        assert b.eval("document.querySelector('#culprit').textContent") == hostile
        b.eval("memdiag.flame.search('</script>')")  # a substring, not a regular expression
        assert b.eval(HIGHLIGHTED) == [hostile]
        b.eval("memdiag.flame.search('(long)')")
        assert b.eval(HIGHLIGHTED) == ["Orders::add(long)"]
        assert b.requests() == [page.as_uri()]


def test_a_kill_incidents_page_charts_what_the_recorder_saw_before_the_kill(tmp_path):
    """memdiag serve's report of a kill's survivor, with the flight recorder's scene of the kill."""
    from memdiag.diagnose.serve.scene import explain

    t0, mib = 1_800_000_000.0, 1 << 20
    cg = [(t0 + 5 * i, {"usage": (10 + 5 * i) * mib, "limit": 64 * mib, "anon": (9 + 5 * i) * mib}) for i in range(11)]
    victim = [(t, {"rss": v["anon"]}) for t, v in cg]
    scene = explain(cg, victim, t0 + 52, 5.0, 64 * mib, victim_name="PID 7 (leak)")
    path = tmp_path / "report.html"
    path.write_text(render_all(leak_report(), scene)["report.html"])
    with Browser(tmp_path / "profile") as b:
        b.open(path.as_uri())
        assert b.errors() == []
        assert b.eval("document.querySelector('#before-the-kill + p').textContent") == scene.text
        assert b.eval("document.querySelector('#scene-chart canvas') !== null")
        labels = b.eval("memdiag.scene.series.map(s => s.label)")
        assert labels == ["seconds before the kill", "cgroup usage", "cgroup limit", "the victim's RSS"]
        assert b.eval("[memdiag.scene.data[0][0], memdiag.scene.data[1].at(-1), memdiag.scene.data[2][0]]") == [
            -52.0,
            60 * mib,
            64 * mib,
        ]
        assert b.eval("memdiag.chart.series.length") > 2  # the window's chart is drawn beside it


def test_a_kill_without_a_diagnosis_is_a_page_of_its_scene(tmp_path):
    """memdiag serve's page of a kill incident that ran no diagnosis: the recorder's scene alone."""
    from memdiag.diagnose.render.html import render_scene_page
    from memdiag.diagnose.serve.scene import explain

    t0, mib = 1_800_000_000.0, 1 << 20
    cg = [(t0 + 5 * i, {"usage": (10 + 5 * i) * mib, "limit": 64 * mib, "anon": (9 + 5 * i) * mib}) for i in range(11)]
    scene = explain(cg, [(t, {"rss": v["anon"]}) for t, v in cg], t0 + 52, 5.0, 64 * mib, victim_name="PID 7 (leak)")
    path = tmp_path / "scene.html"
    path.write_text(render_scene_page("memdiag: oom — incident x", "killed </script><img src=x>", scene))
    with Browser(tmp_path / "profile") as b:
        b.open(path.as_uri())
        assert b.errors() == [] and b.requests() == [path.as_uri()]
        assert b.eval("document.querySelector('#verdict .summary').textContent") == "killed </script><img src=x>"
        assert b.eval("document.querySelector('img') === null")
        assert b.eval("document.querySelector('#scene-chart canvas') !== null")
        assert b.eval("memdiag.scene.data[1].at(-1)") == 60 * mib


def test_the_page_names_no_url_it_could_fetch():
    text = render_all(leak_report())["report.html"]
    assert set(re.findall(r"https?://[^\s\"'<>()\\]*", text)) <= NAMESPACES
    markup = re.sub(r"<script\b.*?</script>", "", text, flags=re.S)
    attrs = re.findall(r"""<[^>]*\s(?:src|srcset|href|action|poster|data|background)\s*=\s*(?!["']?#)""", markup)
    assert attrs == []  # no element that loads anything; links only within the page
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', text).group(1)
    assert csp.startswith("default-src &#x27;none&#x27;; img-src data:;")
    scripts = csp.split("script-src ")[1].split(" ")
    assert len(scripts) == 4 and all(s.startswith("&#x27;sha256-") for s in scripts)  # its own four, by hash
    assert len(text) < 256 * 1024, len(text)


def test_json_for_script_escapes_what_ends_a_script_block():
    value = {"f": "</script><!--<script>&\u2028"}
    out = json_for_script(value)
    assert "<" not in out and ">" not in out and "&" not in out and "\u2028" not in out
    assert json.loads(out) == value


def test_the_chart_draws_a_stack_only_on_the_windows_clock():
    """The fixture's stack has a series but no sample times: it is not drawn, and the page says so;
    given its times and its probe's attach, it is drawn where it was sampled."""
    report = fixture_report()
    chart, notes = chart_data(report)
    assert [s["label"] for s in chart["series"]] == ["process RSS"]
    assert notes == ["Orders::add(long)+0x1c [orderd]: its series has no times on the window's clock: not drawn"]
    stack = report.stacks[0].model_copy(update={"series_s": [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0]})
    row = report.probes[1].model_copy(update={"attached": report.window.started + 9.5})
    report = report.model_copy(update={"stacks": [stack], "probes": [report.probes[0], row, *report.probes[2:]]})
    chart, notes = chart_data(report)
    line = chart["series"][1]
    assert line["label"] == "Orders::add(long)+0x1c [orderd] outstanding (memleak)" and notes == []
    drawn = [(t, v) for t, v in zip(chart["x"], line["values"], strict=True) if v is not None]
    assert drawn[0] == (9.5, 0.0) and drawn[-1] == (21.5, 24 * (1 << 20))


def test_a_series_sample_that_is_no_finite_number_is_left_out_not_the_page():
    report = fixture_report()
    counters = report.counters.model_copy(
        update={
            "labels": {"jvm.heap": "Java heap"},
            "series": {**report.counters.series, "jvm.heap": [(0.0, 1.0), (1.0, float("nan")), (2.0, float("inf"))]},
        }
    )
    chart, notes = chart_data(report.model_copy(update={"counters": counters}))
    heap = next(s for s in chart["series"] if s["label"] == "Java heap")
    assert [v for v in heap["values"] if v is not None] == [1.0]
    assert "Java heap: 2 sample(s) not a finite number: not drawn" in notes
    json_for_script(chart)  # raised ValueError (allow_nan=False) before: the page was lost


def test_the_flame_graphs_tree_sums_each_frame():
    tree = flame_data(["a;b;c 10", "a;b 5", "a;d 7", "x 0", "garbage"])
    assert tree["value"] == 22 and tree["stacks"] == 3
    (a,) = tree["children"]
    assert [(k["name"], k["value"], k["stacks"]) for k in a["children"]] == [("b", 15, 2), ("d", 7, 1)]
    assert flame_data([]) is None


def test_a_counters_table_folds_its_zero_rows_and_others_are_whole():
    md = (
        "# t\n\n## Counters\n\n| counter | first | last | change |\n|---|---|---|---|\n"
        "| rss | 1 MiB | 2 MiB | +1 MiB |\n| swap | 0 B | 0 B |  |\n| psi | – | 0.0% |  |\n\n"
        "## Counters\n\n| at | step | why |\n|---|---|---|\n| 0 s | rule | none |\n"
    )
    body, toc, title = render_body(md)
    assert title == "<h1>t</h1>\n"
    assert toc == [(2, "counters", "Counters"), (2, "counters-2", "Counters")]
    shown, folded = body.split('<details class="quiet">')
    assert "<td>rss</td>" in shown and "<td>swap</td>" not in shown
    assert "<summary>2 row(s) zero throughout</summary>" in folded and "<td>psi</td>" in folded
    assert "<td>0 s</td>" in folded.split("</details>")[1]  # a table of no counters is not folded


def test_a_table_with_a_header_and_no_rows_renders():
    """A section whose table has no rows (a JVM histogram where no class grew: the target's to
    arrange) is rendered, not a StopIteration that lost every file of the report."""
    body, _toc, _title = render_body("## Classes\n\n| class | first | last |\n|---|---|---|\n")
    assert "<table>" in body and "class" in body


def test_a_recorded_scene_that_cannot_be_read_is_a_404_line_not_a_500():
    """An incident stored by another version of serve: its scene no longer validates."""
    from types import SimpleNamespace

    from memdiag.diagnose.serve.app import Refused, _report

    item = SimpleNamespace(report_dir=None, state="recorded", alert={"scene": {"shape": 7, "points": "x"}}, summary="")
    with pytest.raises(Refused) as e:
        _report(None, "abc", item, "html")
    assert e.value.status == 404 and "recorded scene cannot be read" in e.value.reason
