"""The suite's test modules have one basename each: pytest imports them by basename (rootdir import
mode, no packages), and a second tests/*/test_X.py stops the whole collection with "import file
mismatch" (a fresh-clone run did: tests/unit/test_shmwriter.py beside tests/e2e/test_shmwriter.py)."""

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_basename_is_unique():
    names = Counter(p.name for p in TESTS.rglob("test_*.py") if "__pycache__" not in p.parts)
    assert [n for n, k in names.items() if k > 1] == []
