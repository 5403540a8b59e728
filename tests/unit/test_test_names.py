"""The suite's own layout: pytest's default import mode imports each test module by its basename, so two
test files of the same name in different folders stop the whole run at collection (CI once failed in
36 s on tests/e2e/test_long_window.py beside tests/unit/test_long_window.py)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def clashes(root: Path) -> dict[str, list[str]]:
    files = [p for p in root.rglob("test_*.py") if "__pycache__" not in p.parts]
    counts = Counter(p.name for p in files)
    return {n: sorted(str(p.relative_to(root)) for p in files if p.name == n) for n, c in counts.items() if c > 1}


def test_no_two_test_modules_share_a_name():
    assert clashes(TESTS) == {}


def test_the_check_sees_a_clash(tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "test_same.py").write_text("")
    assert clashes(tmp_path) == {"test_same.py": ["a/test_same.py", "b/test_same.py"]}
