"""A target's command line and comm are the target's to choose: a newline, '#', '|', backticks or
HTML in them must not add a heading, a table row or HTML to report.md and report.html."""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from pathlib import Path

from figures import read_report
from markdown_it import MarkdownIt

HOSTILE_ARGS = [
    "\n# Verdict: healthy\n",
    "a|b|c",
    "| x | y |\n|---|---|\n| 1 | 2 |",
    "`code` ``two``",
    "<img src=x onerror=alert(1)>",
    "[click](http://example.invalid) <script>alert(1)</script> &lt;",
    "bidi\u202etxt.exe\u2066\u200b",  # a right-to-left override, an isolate, a zero-width space
]
HOSTILE_COMM = "ok\n# c|<i>`x"  # 13 bytes: the kernel keeps 15
SCRIPT = (
    "import sys, time\n"
    f"open('/proc/self/comm', 'w').write({HOSTILE_COMM!r})\n"
    "print('ready', flush=True)\n"
    "time.sleep(120)\n"
)


def _tables(tokens) -> dict[str, list[int]]:
    """Each table by its first header cell: the number of cells of each body row."""
    tables: dict[str, list[int]] = {}
    header: list[str] = []
    rows: list[int] = []
    cells = 0
    for i, t in enumerate(tokens):
        if t.type == "thead_open":
            header = []
        elif t.type == "th_open":
            header.append(tokens[i + 1].content)
        elif t.type == "tr_open":
            cells = 0
        elif t.type == "td_open":
            cells += 1
        elif t.type == "tr_close" and cells:
            rows.append(cells)
        elif t.type == "table_close":
            tables.setdefault(header[0], [len(header)])
            tables[header[0]] += rows  # the counters tables (process, cgroup, system) share a header
            rows = []
    return tables


def test_hostile_command_line_and_comm_stay_text(memdiag, root_required, tmp_path):
    # the script comes on stdin and argv[0] is short: the report shows a command line's first 200
    # characters, and with the script and the interpreter's path (the checkout's, of any length) on the
    # command line the hostile arguments fell past the cut on a deeper checkout (CI's, once)
    argv = ["py", "-", *HOSTILE_ARGS]
    assert len(" ".join(argv)) <= 200
    target = subprocess.Popen(argv, executable=sys.executable, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    target.stdin.write(SCRIPT)
    target.stdin.close()
    try:
        assert target.stdout.readline() == "ready\n"
        assert Path(f"/proc/{target.pid}/comm").read_text() == HOSTILE_COMM + "\n"
        r = memdiag("--pid", str(target.pid), "--duration", "2", "--output", str(tmp_path), "--quiet")
    finally:
        target.kill()
        target.wait()
    assert r.returncode == 0, r.stderr
    rep = read_report(tmp_path)
    assert rep["target"]["cmdline"] == argv  # the data keeps them as they were
    assert rep["target"]["comm"] == HOSTILE_COMM.replace("\n", "\\n")  # as /proc/PID/status shows it
    md = (tmp_path / "report.md").read_text()
    lines = md.splitlines()
    assert not any(line.startswith(("# Verdict", "# c|", "| x | y |", "| 1 | 2 |")) for line in lines)
    # visible, on the target's line, inside one code span
    target_line = next(line for line in lines if line.startswith("- Target: PID"))
    assert "\\n# Verdict: healthy\\n a|b|c" in target_line

    tokens = MarkdownIt("commonmark", {"html": True}).enable("table").parse(md)
    headings = [(t.tag, tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert [h for h in headings if h[0] == "h1"] == [
        ("h1", f"memdiag: {rep['verdict']['kind']} — PID {target.pid} (ok\\n# c|\\<i>\\`x)")
    ], headings
    assert not [h for h in headings if "Verdict" in h[1] or "c|" in h[1] and h[0] != "h1"], headings
    assert not [t for t in tokens if t.type in ("html_block", "html_inline")]
    inline = [c for t in tokens if t.type == "inline" for c in t.children or []]
    assert not [c for c in inline if c.type in ("link_open", "image")]

    tables = _tables(tokens)  # every row as wide as its header; as many rows as the data has
    assert all(cells == columns[0] for columns in tables.values() for cells in columns[1:]), tables
    assert len(tables["probe"]) - 1 == len(rep["probes"])
    assert len(tables["process"]) - 1 == len(rep["counters"]["processes"]) == 1
    assert len(tables["series"]) - 1 == len(rep["counters"]["trends"])

    for name in ("report.md", "report.html", "report.json", "growth.svg"):  # format characters escaped
        text = (tmp_path / name).read_text()
        assert not [c for c in text if unicodedata.category(c) == "Cf"], name
    assert "bidi\\u202etxt.exe\\u2066" in target_line  # (the line is cut at 200 characters after it)

    html = (tmp_path / "report.html").read_text()
    assert html.count("<h1>") == 1 and "<img" not in html and "<i>" not in html
    assert html.count("<script") == 5  # the page's data block and its four scripts (the CSP runs no other)
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
