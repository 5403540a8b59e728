"""The BPF programs' statistics are named once: the enums of bpf/memdiag.h, mirrored in
probes/bpfstats.py in the same order. Neither side reads or counts a statistic by its number."""

import ast
import re
from pathlib import Path

from memdiag.probes import bpfstats

ROOT = Path(__file__).resolve().parents[2]
# where the Python name says more than the C constant
RENAMED = {"py_dropped": "python_stacks_dropped", "failed": "failed_allocs"}


def _enums(text: str) -> dict[str, list[str]]:
    out = {}
    for name, body in re.findall(r"enum (\w+) \{(.*?)\};", re.sub(r"/\*.*?\*/", "", text, flags=re.S), re.S):
        out[name] = [c.strip() for c in body.split(",") if c.strip()]
    return out


def _mirrored(constants: list[str]) -> tuple[str, ...]:
    *named, count = constants
    assert count.endswith("_COUNT"), constants
    prefix = count[: -len("COUNT")]
    assert all(c.startswith(prefix) for c in named), constants
    return tuple(RENAMED.get(c[len(prefix) :].lower(), c[len(prefix) :].lower()) for c in named)


def test_the_header_and_python_name_each_statistic_alike_in_order():
    enums = _enums((ROOT / "bpf" / "memdiag.h").read_text())
    for enum, names in bpfstats.ENUMS.items():
        assert _mirrored(enums[enum]) == names, enum


def test_the_check_sees_a_statistic_out_of_order():
    swapped = "enum table_stat { TABLE_ST_TABLE_FULL, TABLE_ST_EVENTS, TABLE_ST_COUNT };"
    assert _mirrored(_enums(swapped)["table_stat"]) != bpfstats.TABLE


def test_no_statistic_is_counted_or_read_by_its_number():
    for c in (ROOT / "bpf").glob("*.c"):
        text = c.read_text()
        assert not re.search(r"\bstats\.increment\(\s*\d", text), c.name
        assert not re.search(r"BPF_ARRAY\(stats, u64, \d", text), c.name
    for py in (ROOT / "probes").rglob("*.py"):
        for node in ast.walk(ast.parse(py.read_text())):
            if (
                isinstance(node, ast.Subscript)
                and isinstance(node.value, ast.Subscript)
                and isinstance(node.value.slice, ast.Constant)
                and node.value.slice.value == "stats"
            ):
                assert not isinstance(node.slice, ast.Constant), f"{py}:{node.lineno}"
