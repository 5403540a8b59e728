"""scripts/test.sh runs the suite in three selections (the `hostwide` tests one at a time, beside the
other tests not marked `alone`; then the `alone` ones): together they are the whole suite, each
test in exactly one, and every entry of tests/suiteparts.py's HOSTWIDE names tests that exist (a
renamed file or test would otherwise drop out of its part silently)."""

from suiteparts import HOSTWIDE, collected

PARTS = ("hostwide and not alone", "not hostwide and not alone", "alone")


def test_the_parts_are_the_whole_suite_each_test_once():
    whole = collected("tests")
    parts = [collected("-m", m, "tests") for m in PARTS]
    assert all(parts), [len(p) for p in parts]
    assert sorted(t for p in parts for t in p) == sorted(whole)


def test_every_hostwide_entry_names_collected_tests():
    hostwide = collected("-m", "hostwide", "tests")
    for entry in HOSTWIDE:
        path, _, name = entry.partition("::")
        prefix = f"tests/{path}::{name}"
        assert any(t == prefix or t.startswith(prefix if not name else prefix + "[") for t in hostwide), entry
