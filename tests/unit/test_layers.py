"""Layers import one way: system (readers of /proc and /sys, units, the target, signals) <- probes
<- rules <- diagnose. A reader never learns of a probe, a probe never of the rules or the diagnosis."""

import ast
from pathlib import Path

import pytest
from memdiag.system.units import parse_quantity, parse_size

ROOT = Path(__file__).resolve().parents[2]
MAY_IMPORT = {  # package -> memdiag modules (or packages) it may import besides its own
    "system": set(),
    "probes": {"system", "bpf"},
    # the probe registry's names and the faces' fact declarations (light: neither imports a loader)
    "rules": {"system", "probes.registry", "probes.face"},
}


def _imports(path: Path) -> set[str]:
    """memdiag modules a module imports ("probes.registry", "diagnose"), relative imports resolved
    against its package; `from memdiag import diagnose` and `import memdiag` count too."""
    package = path.relative_to(ROOT).parts[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:
                continue  # from . : within the package
            if node.level == 2:  # from .. : the parent package's sibling (a subpackage's parent)
                base = "memdiag" if path.parent.name == package else f"memdiag.{package}"
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            # `from memdiag import diagnose` imports the package named, not memdiag itself
            names = [f"{module}.{a.name}" for a in node.names] if module == "memdiag" else [module]
        else:
            continue
        out |= {n.removeprefix("memdiag.") for n in names if n == "memdiag" or n.startswith("memdiag.")}
    return out


def _allowed(package: str, module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in (*MAY_IMPORT[package], package))


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_lower_layers_do_not_import_upper_ones(package):
    wrong = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = {m for m in _imports(path) if not _allowed(package, m)}
        if bad:
            wrong[str(path.relative_to(ROOT))] = sorted(bad)
    assert not wrong


def test_the_import_check_sees_every_form(tmp_path):
    """Each way of reaching the diagnosis from a lower layer is seen (a check that cannot fail proves nothing)."""
    forms = {
        "from memdiag.diagnose.engine import Engine": {"diagnose.engine"},
        "from memdiag import diagnose": {"diagnose"},
        "import memdiag.diagnose.triage as t": {"diagnose.triage"},
        "import memdiag": {"memdiag"},
        "from ..diagnose import engine": {"diagnose"},
        "from memdiag.probes import memleak": {"probes"},
    }
    (tmp_path / "rules").mkdir()
    for code, expected in forms.items():
        path = tmp_path / "rules" / "m.py"
        path.write_text(code + "\n")
        global ROOT
        saved, ROOT = ROOT, tmp_path
        try:
            found = _imports(path)
        finally:
            ROOT = saved
        assert found == expected, code
        assert not all(_allowed("rules", m) for m in found), code


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
