"""BPF programs are compiled once per kernel, in a child process: a cold cache compiles, a warm
one loads without compiling, and what `memdiag prepare` compiles is exactly what the probes of a
diagnosis load. A compile error comes back as clang's own words."""

import os
import re
import subprocess

import pytest
from kit import MEMDIAG
from memdiag.probes import brkstack, compiler, drsnoop, faults, memleak, mmapsnoop, oomkill, swapin, vmscan
from memdiag.probes.base import ProbeTarget, load


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

    # The probes, as the engine runs them on a process, find everything they load in the cache.
    monkeypatch.setattr(compiler, "CACHE", tmp_path)
    w = workload("leak", "1024")
    t = ProbeTarget.for_pid(w.pid)
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
