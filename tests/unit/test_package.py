"""The built wheel: one import namespace, BPF sources and playbooks shipped as package data."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from memdiag.probes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_layout(tmp_path):
    # built from a copy: setuptools writes build/ and *.egg-info beside the sources, and the
    # checkout may not be the tester's to write (the fast layer runs unprivileged)
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".*", "tests", "build", "*.egg-info", "__pycache__"))
    out = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(out),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("memdiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"memdiag", next(t for t in top if t.endswith(".dist-info"))}  # nothing else at the top
    probes = ROOT / "probes"
    for spec in REGISTRY.probes:
        assert not spec.bpf or f"memdiag/bpf/{spec.name}.c" in names
        module = Path(spec.loader().__file__)  # probes/NAME.py, or a package's __init__.py
        folder = module.parent if module.name == "__init__.py" else None
        for path in sorted(folder.rglob("*.py")) if folder else [module]:  # a package is shipped whole
            assert f"memdiag/probes/{path.relative_to(probes)}" in names
    assert "memdiag/bpf/memdiag.h" in names
    for module in (
        "diagnose/cli.py",
        "diagnose/commands/run.py",
        "diagnose/commands/serve.py",
        "diagnose/render/markdown.py",
        "system/meminfo.py",
        "system/units.py",
        "diagnose/serve/app.py",
        "rules/engine.py",
        "playbooks/default.yaml",
        "playbooks/wrappers.yaml",
        "diagnose/culprit.py",
        "probes/forwarders.py",
    ):
        assert f"memdiag/{module}" in names, module
    # report.html's vendored scripts and styles, inlined at render time, with their licences
    assets = ROOT / "diagnose" / "render" / "assets"
    shipped = sorted(p.name for p in assets.iterdir())
    assert {"uPlot.iife.min.js", "d3-flamegraph.min.js", "report.js", "uPlot.LICENSE", "d3.LICENSE"} <= set(shipped)
    for name in shipped:
        assert f"memdiag/diagnose/render/assets/{name}" in names, name


def test_bpf_sources_load_from_the_installed_package():
    from memdiag.probes.compiler import source

    src = source("faults")
    assert src.is_absolute() and src.exists() and (src.parent / "memdiag.h").exists()
