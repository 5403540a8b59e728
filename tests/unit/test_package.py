"""The built wheel: one import namespace, BPF sources and playbooks shipped as package data."""

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_layout(tmp_path):
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
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("memdiag-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"memdiag", next(t for t in top if t.endswith(".dist-info"))}  # nothing else at the top
    for probe in ("faults", "memleak", "oomkill", "swapin", "vmscan", "drsnoop", "brkstack", "mmapsnoop"):
        assert f"memdiag/bpf/{probe}.c" in names
        assert f"memdiag/probes/{probe}.py" in names
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


def test_bpf_sources_load_from_the_installed_package():
    from memdiag.probes.compiler import source

    src = source("faults")
    assert src.is_absolute() and src.exists() and (src.parent / "memdiag.h").exists()
