"""scripts/test.sh runs the suite in three selections (the `hostwide` tests one at a time, beside the
other tests not marked `alone`; then the `alone` ones): together they are the whole suite, each
test in exactly one, and every entry of tests/suiteparts.py's HOSTWIDE names tests that exist (a
renamed file or test would otherwise drop out of its part silently)."""

import subprocess
import sys
from pathlib import Path

from suiteparts import HOSTWIDE

ROOT = Path(__file__).resolve().parents[2]
PARTS = ("hostwide and not alone", "not hostwide and not alone", "alone")


def _collected(*args: str) -> list[str]:
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args, "tests"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode in (0, 5), r.stdout + r.stderr
    return [line for line in r.stdout.splitlines() if "::" in line]


def test_the_parts_are_the_whole_suite_each_test_once():
    whole = _collected()
    parts = [_collected("-m", m) for m in PARTS]
    assert all(parts), [len(p) for p in parts]
    assert sorted(t for p in parts for t in p) == sorted(whole)


def test_every_hostwide_entry_names_collected_tests():
    hostwide = _collected("-m", "hostwide")
    for entry in HOSTWIDE:
        path, _, name = entry.partition("::")
        prefix = f"tests/{path}::{name}"
        assert any(t == prefix or t.startswith(prefix if not name else prefix + "[") for t in hostwide), entry
