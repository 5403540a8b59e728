"""memdiag's own footprint (issue 26, item 5): what a diagnosis imports before it has anything to
render, for a target that is no JVM, Go or Node program, leaves out what only a report, serve, a
C++ name or a runtime needs. Each module below cost memdiag's resident memory when imported at
start (scripts/footprint.py measures the whole: peak RSS of a diagnosis of the kit's leak)."""

import json
import subprocess
import sys

NOT_AT_START = [
    "markdown_it",  # report.html (diagnose/render/html.py)
    "html.entities",  # the renderers
    "sqlite3",  # serve's store
    "cxxfilt",  # a C++ name (probes/stacks.py demangle)
    "multi_demangle",  # a Rust name (probes/stacks.py demangle)
    "capstone",  # the disassembler: for a file whose code facts are not remembered (probes/codefacts.py)
    "_hashlib",  # OpenSSL's libcrypto: the cache keys take CPython's own SHA-256 (probes/compiler.py)
    "secrets",  # a JFR recording's token (imports hmac, hence libcrypto)
    "memdiag.probes.jvm.probe",  # the JVM's recorder, its price, its meter
    "memdiag.probes.jvm.plan",
    "memdiag.probes.jvm.meter",
    "memdiag.probes.jvm.perfmap",  # a JIT frame's perf map (with the JVM's attach)
    "memdiag.probes.go.memory",  # a Go program's memory reader
    "memdiag.probes.go.pclntab",  # a Go executable's function table
    "memdiag.system.v8memory",  # Node's heap reader
]

IMPORTS = """
import json, sys
import memdiag.diagnose.cli as cli
cli._commands()
from memdiag.rules.catalog import FACTS
import memdiag.diagnose.workflow, memdiag.diagnose.engine, memdiag.probes.memleak
from memdiag.probes.registry import REGISTRY
REGISTRY.faces()
print(json.dumps(sorted(sys.modules)))
"""


def test_a_diagnosis_imports_at_start_none_of_what_only_a_report_or_a_runtime_needs():
    out = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert [m for m in NOT_AT_START if m in loaded] == []


def test_the_runtime_models_are_built_at_their_first_use():
    """Their faces are imported for every target; their pydantic models (deferred) are built when
    their probe runs, and then validate as before."""
    from memdiag.probes.go.heap import GoHeapResult
    from memdiag.probes.jvm.histogram import HistogramResult
    from memdiag.probes.jvm.result import JfrResult
    from memdiag.probes.node.heap import NodeHeapResult

    for model in (GoHeapResult, HistogramResult, JfrResult, NodeHeapResult):
        r = model(name="x", status="ok", duration_s="1.5")
        assert r.duration_s == 1.5 and model.__pydantic_complete__


MODELS = (
    IMPORTS.rsplit("print(", 1)[0]
    + """
from pydantic import BaseModel
from memdiag.system._parse import Model
exec(sys.argv[1])  # the can-fail test's stray model
def walk(c):
    for s in c.__subclasses__():
        yield s
        yield from walk(s)
ours = {c for c in walk(BaseModel) if c.__module__.startswith("memdiag.")}
print(json.dumps({
    "count": len(ours),
    "not_deferred": sorted(c.__qualname__ for c in ours if not issubclass(c, Model)),
    "built": sorted(c.__qualname__ for c in ours if c.__pydantic_complete__),
}))
"""
)
STRAY = "class Stray(BaseModel):\n    __module__ = 'memdiag.stray'\n    x: int = 0\n"


def _models(extra: str = "") -> dict:
    run = subprocess.run([sys.executable, "-c", MODELS, extra], capture_output=True, text=True, check=True)
    return json.loads(run.stdout)


def test_every_model_is_built_at_its_first_use_not_at_import():
    """Every pydantic model memdiag defines derives from system._parse.Model (defer_build), so a
    diagnosis builds the ones its path uses; a diagnosis's imports build only those a default value
    or a forward reference builds at once."""
    out = _models()
    assert out["count"] > 100  # the walk saw memdiag's models
    assert out["not_deferred"] == []
    # Cost and Culprit: default values of other models; AllOf/AnyOf/NotOf: model_rebuild (rules/model.py)
    assert set(out["built"]) <= {"Cost", "Culprit", "AllOf", "AnyOf", "NotOf"}


def test_the_check_for_models_outside_the_base_can_fail():
    out = _models(STRAY)
    assert out["not_deferred"] == ["Stray"] and "Stray" in out["built"]
