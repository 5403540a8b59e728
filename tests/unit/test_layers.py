"""Layers import one way: system (readers of /proc and /sys, units) <- probes <- diagnose, and
rules <- diagnose. A reader never learns of a probe, a probe never of the diagnosis."""

import ast
from pathlib import Path

import pytest
from memdiag.system.units import parse_quantity, parse_size

ROOT = Path(__file__).resolve().parents[2]
MAY_IMPORT = {  # package -> memdiag packages it may import besides itself
    "system": set(),
    "probes": {"system", "bpf"},
    "rules": {"system", "probes"},  # the probe registry's names (probes/registry.py, light)
}


def _imports(path: Path) -> set[str]:
    """memdiag packages a module imports, relative imports resolved against its package."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . / from .. : within the package, or its parent's sibling
                if node.level == 1 or (node.level == 2 and path.parent.parent.name in MAY_IMPORT):
                    continue
                names = [f"memdiag.{node.module or ''}"]
            else:
                names = [node.module or ""]
        else:
            continue
        out |= {n.split(".")[1] for n in names if n.startswith("memdiag.") and n.count(".") >= 1}
    return out


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_lower_layers_do_not_import_upper_ones(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = _imports(path) - MAY_IMPORT[package] - {package}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong


def test_one_size_parser_refuses_the_ambiguous_m():
    assert parse_size("64MiB") == parse_size("64 mib") == 64 << 20
    assert parse_size("4096") == 4096 and parse_size("1.5GiB") == 3 << 29
    for text in ("1m", "1M"):  # mebibytes on the command line, minutes in a rule: now neither
        with pytest.raises(ValueError, match="write 1min for a duration or 1MiB for a size"):
            parse_size(text)
    with pytest.raises(ValueError, match="is not a size"):
        parse_size("5min")
    with pytest.raises(ValueError, match="cannot be negative"):
        parse_size("-1KiB")
    assert parse_quantity("5min") == (300, "seconds")
