"""BPF programs are compiled once per kernel, in a child process: a cold cache compiles, a warm
one loads without compiling, and what `memdiag prepare` compiles is exactly what the probes of a
diagnosis load. A compile error comes back as clang's own words."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kit import MEMDIAG
from memdiag.probes import brkstack, compiler, drsnoop, faults, memleak, mmapsnoop, oomkill, swapin, vmscan
from memdiag.probes.base import load
from memdiag.system.target import Target


def _prepare(cache) -> str:
    r = subprocess.run(
        [MEMDIAG, "prepare"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MEMDIAG_BPF_CACHE": str(cache)},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_prepare_compiles_once_and_covers_a_diagnosis(tmp_path, monkeypatch, workload):
    cold = _prepare(tmp_path)
    compiled = int(re.search(r"(\d+) compiled, 0 already cached", cold).group(1))
    files = sorted(p.name for p in tmp_path.glob("*.json"))
    assert compiled == len(files) >= 9
    assert {f.split("-")[0] for f in files} >= {
        "faults", "memleak", "ratecount", "brkstack", "mmapsnoop", "oomkill", "swapin", "vmscan", "drsnoop"
    }  # fmt: skip
    assert f"0 compiled, {compiled} already cached" in _prepare(tmp_path)
    # and this host's trap costs, measured at set-up rather than by whichever diagnosis first needs them
    assert re.search(r"this host's uprobe trap costs: [\d,]+ ns emulated, [\d,]+ ns single-stepped", cold), cold

    # The probes, as the engine runs them on a process, find everything they load in the cache.
    monkeypatch.setattr(compiler, "CACHE", tmp_path)
    w = workload("leak", "1024")
    t = Target.for_pid(w.pid)
    results = [m.run(t, 1) for m in (faults, memleak, brkstack, mmapsnoop, swapin, vmscan, drsnoop)]
    assert [r.status for r in results] == ["ok"] * len(results), [(r.name, r.reason) for r in results]
    oomkill.OomWatch().close()
    load("ratecount", {}).cleanup()
    assert sorted(p.name for p in tmp_path.glob("*.json")) == files


def test_compile_error_carries_clangs_words(tmp_path, monkeypatch):
    monkeypatch.setattr(compiler, "CACHE", tmp_path)
    with pytest.raises(compiler.CompileError, match=r"error"):
        compiler.compiled("faults", {"TARGET_MODE": "(", "PER_PROCESS": 0})
    assert list(tmp_path.glob("*.json")) == []


def test_a_diagnosis_never_maps_the_compiler(workload):
    """The probes of a diagnosis load cached bytecode: no bcc module, no LLVM in the process."""
    w = workload("leak", "1024")
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from memdiag.probes import faults, memleak, swapin\n"
        "from memdiag.system.target import Target\n"
        f"t = Target.for_pid({w.pid})\n"
        "print([m.run(t, 1).status for m in (faults, memleak, swapin)])\n"
        "print('bcc' in sys.modules, 'LLVM' in Path('/proc/self/maps').read_text())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["['ok', 'ok', 'ok']", "False False"]


def test_a_cache_others_can_write_is_not_trusted(tmp_path, monkeypatch):
    """Cached bytecode is loaded into the kernel: a group- or world-writable cache is passed over."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    monkeypatch.setattr(compiler, "CACHE", open_dir)
    private = compiler.cache_dir()
    assert private != open_dir and private.stat().st_mode & 0o077 == 0
    open_dir.chmod(0o755)
    assert compiler.cache_dir() == open_dir


def test_the_private_folder_used_instead_is_removed_when_memdiag_exits(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    code = "from memdiag.probes import compiler\nd = compiler.cache_dir()\nprint(d, d.is_dir())\n"
    env = {**os.environ, "MEMDIAG_BPF_CACHE": str(open_dir)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    private, existed = r.stdout.split()
    assert existed == "True" and "memdiag-bpf-" in private and private != str(open_dir)
    assert not Path(private).exists()
