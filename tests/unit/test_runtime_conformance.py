"""Every runtime is its face (probes/runtime.py), and the diagnosis reads nothing else of it: each
listed runtime yields exactly the facts it declares, each in the catalog as declared; and a runtime
added as one package plus one entry of the registry's RUNTIMES is recognised in a real process, its
counters sampled with the window's, and its facts, rows, series and sections reach a verdict and
report.md, report.json and report.html, with no change to diagnose/ or rules/."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from memdiag.probes.face import FactDef
from memdiag.probes.node.window import V8HeapSample
from memdiag.probes.registry import REGISTRY
from memdiag.probes.runtime import RuntimeFace, Samples
from memdiag.rules.catalog import facts as catalog
from memdiag.system.jvm import JvmCounters, JvmMemory, JvmSample

MiB = 1 << 20


def _jvm_samples() -> Samples:
    """A JVM's counters over ten seconds: a collection every other second, its RSS split by smaps."""
    return [
        (float(t), JvmSample(counters=JvmCounters(clock_s=float(t), heap_used=(20 + t) * MiB, heap_max=1024 * MiB,
                                                  heap_committed=400 * MiB, after_gc_used=(10 + t) * MiB,
                                                  gc_count=t // 2, evacuations=t // 2, metaspace_committed=8 * MiB),
                             memory=JvmMemory(rss=(90 + t) * MiB, heap=(50 + t) * MiB, code=2 * MiB, stacks=MiB,
                                              metaspace=8 * MiB, files=20 * MiB, other=9 * MiB)))
        for t in range(10)
    ]  # fmt: skip


# (samples its sample() could have read, the pid) for each listed runtime: what its facts need. A
# CPython face reads the interpreter's frames of a live process: this one, which runs CPython.
EXAMPLES: dict[str, list[tuple[Samples, int | None]]] = {
    "cpython": [([], os.getpid())],
    "node": [([], os.getpid()), ([(float(t), V8HeapSample(mapped=(8 + t) * MiB)) for t in range(6)], 7)],
    "jvm": [([], 7), (_jvm_samples(), 7), ([(0.0, JvmSample(missing="-XX:-UsePerfData"))], 7)],
    "go": [([], os.getpid())],
}


def problems(face: RuntimeFace, examples: list[tuple[Samples, int | None]]) -> list[str]:
    """What the face's facts_of does that its declaration does not say, over its examples."""
    declared = {f.name for f in face.facts}
    produced: set[str] = set()
    for samples, pid in examples:
        produced |= set(face.facts_of(samples, pid))
    out = [f"yields {n}, which it does not declare" for n in sorted(produced - declared)]
    out += [f"declares {n}, which it never yields" for n in sorted(declared - produced)]
    return out


def test_every_runtime_has_an_example():
    assert set(EXAMPLES) == set(REGISTRY.runtime_names()), "a runtime of the registry without an example here"


@pytest.mark.parametrize("name", REGISTRY.runtime_names())
def test_a_runtime_yields_exactly_the_facts_it_declares(name):
    face = REGISTRY.runtime(name)
    assert face is not None and face.name == name
    assert problems(face, EXAMPLES[name]) == []
    known = catalog()
    for fact in face.facts:
        assert known[fact.name] == fact, fact.name  # the catalog's entry is the face's own


@pytest.mark.parametrize("name", REGISTRY.runtime_names())
def test_a_runtime_says_only_anonymous_parts_under_its_own_keys(name):
    """resident(): parts of the process's anonymous memory named runtime_*, none twice, none negative."""
    face = REGISTRY.runtime(name)
    if face.resident is None:
        return
    for samples, pid in EXAMPLES[name]:
        parts = face.resident(samples, pid)
        keys = [p.key for p in parts]
        assert all(k.startswith("runtime_") for k in keys) and len(set(keys)) == len(keys)
        assert all(p.bytes >= 0 for p in parts)


def test_the_jvm_says_its_heap_metaspace_code_and_stacks_and_not_its_files():
    parts = {p.key: p for p in REGISTRY.runtime("jvm").resident(_jvm_samples(), 7)}
    assert {k: p.bytes for k, p in parts.items()} == {
        "runtime_heap": 59 * MiB, "runtime_metaspace": 8 * MiB, "runtime_code": 2 * MiB, "runtime_stacks": MiB,
    }  # fmt: skip
    assert parts["runtime_metaspace"].estimate and not parts["runtime_heap"].estimate  # committed, not resident
    assert REGISTRY.runtime("jvm").resident([(0.0, JvmSample(missing="-XX:-UsePerfData"))], 7) == []


def test_the_check_fails_for_a_runtime_that_declares_a_fact_it_never_yields():
    bad = RuntimeFace(
        name="bad", display="Bad", facts=(FactDef("bad.heap", "bytes", "its heap"), FactDef("bad.gc", "number", "")),
        facts_of=lambda samples, pid: {"bad.heap": 1, "bad.extra": 2},
    )  # fmt: skip
    assert problems(bad, [([], 1)]) == ["yields bad.extra, which it does not declare",
                                        "declares bad.gc, which it never yields"]  # fmt: skip


def test_a_runtime_named_nowhere_is_none_and_the_names_are_the_catalogs():
    assert REGISTRY.runtime("dotnet") is None and REGISTRY.runtime(None) is None
    help = catalog()["target.runtime"].help
    assert all(name in help for name in REGISTRY.runtime_names())


TOY_PACKAGE = '''
"""A toy runtime: a program named toyvm, whose "heap" is its resident memory (statm)."""
from pathlib import Path

from memdiag.probes.face import FactDef, Section
from memdiag.probes.runtime import RuntimeFace, RuntimeRow
from memdiag.system.ledger import AnonPart
from memdiag.system._parse import Fact
from memdiag.system.runtime import Runtime


class ToySample(Fact):
    heap: int


def recognise(seen):
    return Runtime(name="toyrt", label="ToyRT", version="1.0", module=seen.path, detail="toy build 7")


def sample(pid, proc_root):
    statm = (Path(proc_root) / str(pid) / "statm").read_text().split()
    return ToySample(heap=int(statm[1]) * 4096)


def facts_of(samples, pid):
    return {"toyrt.heap": samples[-1][1].heap if samples else None, "toyrt.samples": len(samples)}


RUNTIME = RuntimeFace(
    name="toyrt", display="ToyRT", maps=lambda base: base == "toyvm", recognise=recognise, sample=sample,
    facts=(FactDef("toyrt.heap", "bytes", "the toy heap, at the end"),
           FactDef("toyrt.samples", "number", "samples that read the toy heap")),
    facts_of=facts_of,
    rows=lambda s: [RuntimeRow(name="heap", unit="bytes", first=s[0][1].heap, last=s[-1][1].heap)] if s else [],
    series=lambda s, t0: {"toyrt.heap": [(t - t0, float(x.heap)) for t, x in s]},
    labels={"toyrt.heap": "ToyRT heap"},
    sections=lambda s: [Section(probe="counters", title="Toy heap", lines=[f"{len(s)} samples read"])],
    resident=lambda s, pid: [AnonPart(key="runtime_arena", label="toy arena, resident", bytes=4096, source="ToyRT")],
)
'''

TOY_RULES = """
rules:
  - id: toy-heap-held
    description: the toy runtime's own counters say what it holds
    when: toyrt.heap > 0
    then:
      finding: "the toy heap holds {toyrt.heap}"
      verdict:
        kind: growth
        summary: "{target.name}: the toy heap holds {toyrt.heap} over {toyrt.samples} samples"
        confidence: 0.8
        priority: 99
"""

# In a fresh interpreter: the package on the path and its one RUNTIMES entry, added before anything
# reads the registry; then recognition of the real process, a real window of samples, the rules,
# the verdict, and the report.
TOY_RUN = """
import json, sys
sys.path[:0] = [{folder!r}]
from memdiag.probes import registry
registry.REGISTRY.runtimes += (registry.RuntimeSpec("toyrt", module="toyrt"),)
from pathlib import Path
from memdiag.diagnose.assemble import assemble
from memdiag.diagnose.engine import Engine
from memdiag.diagnose.observe import Sampler
from memdiag.diagnose.render import render_all
from memdiag.rules.loader import load_playbooks, shipped_playbooks
from memdiag.system.target import Target

rules = load_playbooks(shipped_playbooks() + [Path({rules!r})], trusted=False)
target = Target.for_pid({pid}, "toyvm")
engine = Engine(rules, target, 1.0, 2.0)
sampler = Sampler(target, 1.0, 0.1, runtime=registry.REGISTRY.runtime(engine.runtime.name))
sampler.run()
obs = sampler.so_far(closing=True)
facts, _c, _t = engine.facts_of(obs)
report = assemble(engine.finish(obs, False), 2.0)
files = render_all(report)
seen = {{"report": json.loads(files["report.json"]), "md": files["report.md"], "html": files["report.html"],
         "facts": {{k: v for k, v in facts.items() if k.startswith(("toyrt.", "target.runtime"))}}}}
print(json.dumps(seen))
"""


def test_a_runtime_added_as_one_package_and_one_list_entry_reaches_a_verdict_and_every_format(tmp_path):
    (tmp_path / "toyrt").mkdir()
    (tmp_path / "toyrt" / "__init__.py").write_text(TOY_PACKAGE)
    rules = tmp_path / "toy.yaml"
    rules.write_text(TOY_RULES)
    toyvm = tmp_path / "toyvm"
    shutil.copy(shutil.which("sleep"), toyvm)  # a real process whose executable mapping is named toyvm
    proc = subprocess.Popen([str(toyvm), "60"])
    try:
        code = TOY_RUN.format(folder=str(tmp_path), rules=str(rules), pid=proc.pid)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    rep, md, html, facts = seen["report"], seen["md"], seen["html"], seen["facts"]
    assert facts["target.runtime"] == "toyrt"
    assert facts["target.runtime_detail"] == f"ToyRT 1.0 ({toyvm}; toy build 7)"
    assert facts["toyrt.heap"] > 0 and facts["toyrt.samples"] >= 3
    v = rep["verdict"]
    assert (v["kind"], v["rule"]) == ("growth", "toy-heap-held"), v
    assert f"PID {proc.pid} (toyvm): the toy heap holds" in v["summary"]
    counters = rep["counters"]
    assert counters["runtime"] == "ToyRT" and counters["labels"] == {"toyrt.heap": "ToyRT heap"}
    (row,) = [r for r in counters["rows"] if r["scope"] == "runtime"]
    assert row["name"] == "heap" and row["last"] == facts["toyrt.heap"]
    assert counters["trends"]["toyrt.heap"]["last"] == facts["toyrt.heap"]
    assert "### ToyRT counters" in md and "| ToyRT heap |" in md and "### Toy heap" in md
    assert "ToyRT counters" in html and "ToyRT heap" in html and "Toy heap" in html
    assert any(s["title"] == "Toy heap" for s in rep["sections"])
    # its part of the process's anonymous memory, in the split by holder, summing with the residual
    split = counters["ledgers"][0]["anon_split"]
    (toy,) = [p for p in split["parts"] if p["key"] == "runtime_arena"]
    assert toy["bytes"] == 4096 and toy["source"] == "ToyRT"
    assert sum(p["bytes"] for p in split["parts"]) + split["residual"] == split["total"]
    assert "| toy arena, resident | 4.0 KiB |" in md and "toy arena, resident" in html


def test_the_runtime_list_is_the_one_place_recognition_reads(tmp_path):
    """A runtime's face alone tells it: Python's own mapping is CPython's, a renamed copy no face claims is none."""
    assert REGISTRY.recognise(os.getpid()).name == "cpython"
    plain = tmp_path / "plainvm"
    shutil.copy(shutil.which("sleep"), plain)
    proc = subprocess.Popen([str(plain), "60"])
    try:
        assert REGISTRY.recognise(proc.pid) is None
    finally:
        proc.kill()
        proc.wait()
    assert REGISTRY.recognise(proc.pid) is None  # gone
