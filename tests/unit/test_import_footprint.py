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
    "capstone",  # the disassembler: for a file whose code facts are not remembered (probes/codefacts.py)
    "_hashlib",  # OpenSSL's libcrypto: the cache keys take CPython's own SHA-256 (probes/compiler.py)
    "secrets",  # a JFR recording's token (imports hmac, hence libcrypto)
    "memdiag.probes.jvm.probe",  # the JVM's recorder, its price, its meter
    "memdiag.probes.jvm.plan",
    "memdiag.probes.jvm.meter",
    "memdiag.probes.jit",  # a JIT frame's perf map (with the JVM's attach)
    "memdiag.probes.gomemory",  # a Go program's memory reader
    "memdiag.probes.gopclntab",  # a Go executable's function table
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
    from memdiag.probes.goheap import GoHeapResult
    from memdiag.probes.jvm.histogram import HistogramResult
    from memdiag.probes.jvm.result import JfrResult
    from memdiag.probes.nodeheap import NodeHeapResult

    for model in (GoHeapResult, HistogramResult, JfrResult, NodeHeapResult):
        r = model(name="x", status="ok", duration_s="1.5")
        assert r.duration_s == 1.5 and model.__pydantic_complete__
