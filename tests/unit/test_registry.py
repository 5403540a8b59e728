"""The probe registry is the one list of probes: a probe added to it alone reaches the rule model,
`memdiag probe`'s choices, prepare's program list and the probe table's fact rows, and no module
of the package spells a list of probe names of its own."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from memdiag.probes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: a fake probe (run by vmscan's loader) added to the registry before anything
# reads it, then what each reader sees.
_WITH_FAKE = """
import argparse, json, sys
sys.path.insert(0, {folder!r})
from memdiag.probes import registry
registry.REGISTRY.probes += (
    registry.ProbeSpec("fakeprobe", module="fakeprobe"),  # with a BPF program (vmscan's, compiled as its own)
    registry.ProbeSpec("fakereader", module="fakereader", bpf=False),  # reads a runtime's counters: no BPF
)
from memdiag.rules.model import ProbeRequest
from memdiag.diagnose.commands import probe as command
from memdiag.diagnose.factset import probe_figures
from memdiag.probes import prepare
parser = argparse.ArgumentParser()
command.add_arguments(parser)
choices = next(a.choices for a in parser._actions if a.dest == "name")
print(json.dumps({{
    "rule": [ProbeRequest(name="fakeprobe").name, ProbeRequest(name="fakereader").name],
    "cli": choices,
    "options": [a.dest for a in parser._actions],
    "prepare": [name for name, _ in prepare.programs("pid")],
    "figures": probe_figures({{"fake.level": 1.0}}),
}}))
"""
_FAKE = """
from memdiag.probes.face import Face, FactDef, Option, plain
from memdiag.probes.vmscan import FILTERED, run
FACE = Face(name="{name}", run=plain(run), facts=(FactDef("{fact}", "number", "a level"),),
            options=(Option("--{name}-depth", "count", "how deep"),))
"""


# prepare's compile options ask the kernel what it offers (tracefs: kprobes for swapin), which only root may read
@pytest.mark.bpf
def test_a_probe_added_to_the_registry_alone_reaches_every_reader(tmp_path):
    (tmp_path / "fakeprobe.py").write_text(_FAKE.format(name="fakeprobe", fact="fake.level"))
    (tmp_path / "fakereader.py").write_text(_FAKE.format(name="fakereader", fact="fakereader.level"))
    code = _WITH_FAKE.format(folder=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["rule"] == ["fakeprobe", "fakereader"]
    assert {"fakeprobe", "fakereader", "reach", "memleak"} <= set(seen["cli"])
    assert "fakeprobe_depth" in seen["options"] and "fakereader_depth" in seen["options"]
    # compiled ahead of time: the probe with a BPF program, not the reader without one
    assert seen["prepare"][0] == "ratecount" and seen["prepare"][-1] == "fakeprobe"
    assert "fakereader" not in seen["prepare"]
    assert seen["figures"] == {"fakeprobe": {"fake.level": 1.0}}


# prepare's compile options ask the kernel what it offers (tracefs: kprobes for swapin), which only root may read
@pytest.mark.bpf
def test_the_readers_agree_with_the_registry_as_shipped():
    from memdiag.probes.prepare import programs
    from memdiag.rules.model import ProbeRequest

    names = REGISTRY.names
    assert names == (
        "faults", "goheap", "memleak", "brkstack", "mmapsnoop", "fdstack", "shmwriter", "kmemstack", "sites", "oomkill",
        "swapin", "vmscan", "drsnoop", "nodeheap", "jfr", "histogram",
    )  # fmt: skip
    assert ProbeRequest.model_fields["name"].annotation.__args__ == names
    # no BPF program: nothing compiled for them (jfr: the JVM's recorder; histogram: its jcmd)
    readers = {"goheap", "nodeheap", "jfr", "histogram"}
    assert [p for p, _ in programs("system")] == ["ratecount", *(n for n in names if n not in readers)]
    rows = REGISTRY.figure_rows()
    assert rows["reclaim.stall_time"] == "drsnoop" and rows["reach.leaked_count"] == "reach"
    assert "alloc.tracing" not in rows  # memleak's budget decision: a fact, no figure of the table
    for spec in REGISTRY.probes:  # each face has what the registry's readers call, under its own name
        face = spec.face()
        assert face.name == spec.name and callable(face.run) and callable(face.describe), spec.name


def _name_lists(path: Path, names: set[str]) -> list[str]:
    """Literal tuples, lists, sets and dict keys in a module naming three or more probes."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        items = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None)
        if not isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict) or not items:
            continue
        named = {i.value for i in items if isinstance(i, ast.Constant) and i.value in names}
        if len(named) >= 3:
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {sorted(named)}")
    return found


@pytest.mark.parametrize("kind", ["probe", "runtime"])
def test_no_second_list_of_probes_or_runtimes_in_the_package(kind):
    names = set(REGISTRY.names if kind == "probe" else REGISTRY.runtime_names())
    lists = []
    for package in ("probes", "diagnose", "rules", "system"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name != "registry.py":
                lists += _name_lists(path, names)
    assert not lists, f"{kind} names listed outside probes/registry.py"


def test_the_rule_model_loads_no_probe_loader():
    code = "import sys, memdiag.rules.model; print(sorted(m for m in sys.modules if m.startswith('memdiag.probes')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # the registry and the faces' types (a probe's, a runtime's): no loader (the catalog reads the
    # faces when first asked)
    loaded = "['memdiag.probes', 'memdiag.probes.face', 'memdiag.probes.registry', 'memdiag.probes.runtime']"
    assert out.stdout.strip() == loaded
