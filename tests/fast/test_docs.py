"""The documentation's front door and its links: README.md stays a page a paged engineer reads in
two minutes (15,000 characters at most, the three questions answered in its first screenful), CI
runs the test command it gives, every relative link in README.md and docs/ reaches a file (and a
heading, where it names one), and docs/playbooks.md's generated reference matches the code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted([README, *(ROOT / "docs").rglob("*.md")])

_FENCE = re.compile(r"^\s*(```|~~~)")
_LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a shell block is no heading)."""
    out, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: markup dropped, lower case, every character but
    letters, digits, '_', '-' and spaces removed, spaces made '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in _prose_lines(page.read_text()):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(page: Path) -> list[str]:
    found = []
    for line in _prose_lines(page.read_text()):
        found += _LINK.findall(_CODE_SPAN.sub("", line))
    return found


def test_slug_follows_github():
    assert slug("1. What tracing costs the target, by the target's own clock") == (
        "1-what-tracing-costs-the-target-by-the-targets-own-clock"
    )
    assert slug("In `memdiag serve`") == "in-memdiag-serve"
    assert slug("report.json") == "reportjson"


def test_readme_is_at_most_15000_characters():
    size = len(README.read_text())
    assert size <= 15_000, f"README.md is {size:,} characters; move the detail under docs/"


def test_readme_gives_the_setup_and_the_test_command_ci_runs():
    first_block = README.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [line.split("#", 1)[0].strip() for line in first_block.splitlines()]
    assert commands[:2] == ["scripts/setup.sh", "./scripts/test.sh"]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "exec ./scripts/test.sh" in ci  # CI runs exactly the README's test command


def test_readme_answers_the_three_questions_in_its_first_screenful():
    screen = "\n".join(README.read_text().splitlines()[:50])
    assert re.search(r"memdiag (-p|--pid) \d+", screen)  # how to diagnose a PID
    assert "| `leak` |" in screen and "| `inconclusive` |" in screen  # what the verdict words mean
    assert "[below](#hook-it-to-alertmanager)" in screen  # how to hook it to Alertmanager: one link
    assert "hook-it-to-alertmanager" in anchors(README)


def test_readme_defines_every_verdict_word():
    spec = re.search(r"VerdictKind = Literal\[([^\]]*)\]", (ROOT / "diagnose" / "report.py").read_text())
    kinds = re.findall(r'"(\w+)"', spec.group(1))
    assert len(kinds) == 7
    table = README.read_text().split("## The verdict words", 1)[1].split("\n## ", 1)[0]
    assert [k for k in kinds if f"| `{k}` |" not in table] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert broken == []


def test_the_playbook_reference_is_generated_from_the_code():
    spec = importlib.util.spec_from_file_location("playbook_reference", ROOT / "scripts" / "playbook_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    page = ref.PAGE.read_text()
    assert ref.BEGIN in page and page.rstrip().endswith(ref.END)
    generated = ref.render()
    assert "`leak-unreachable` (default.yaml:" in generated and "| `process.rss` |" in generated
    assert page == ref.current(page), "docs/playbooks.md is out of date: run scripts/playbook_reference.py"
