"""What memdiag reads from machine code is remembered per file (probes/codefacts.py): a second
memdiag placing memleak's probes in the same C library, and reading whether the same functions
only forward an allocation, gets the same answers from the store and never loads capstone (about
10 MiB of its resident memory); a store written by other decoders is read again. Real files: this
interpreter's own libc and the python3 executable; fresh interpreters, each with its own store."""

from __future__ import annotations

import json
import os
import subprocess
import sys

READ = """
import json, os, sys
from memdiag.probes import codefacts
from memdiag.probes.allocator import find_allocator
from memdiag.probes.elf import elf_info
from memdiag.probes.stacks import _forwards_cached
a = find_allocator(os.getpid())
elf = elf_info(os.path.realpath(sys.executable))
syms = sorted((s for s in elf.symbols() if 0 < s.size <= 320), key=lambda s: s.address)[:40]
fwd = [_forwards_cached(elf, s) for s in syms]
places = [(p.function, p.symbol_address, p.offset, p.instruction, p.emulated, p.return_probe) for p in a.placements]
print(json.dumps({"name": a.name, "places": places, "forwarded": a.forwarded, "forwards": fwd,
                  "capstone": "capstone" in sys.modules}))
"""


def _read(store) -> dict:
    env = {**os.environ, "MEMDIAG_CODE_FACTS": str(store)}
    out = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout)


def test_a_second_run_places_the_probes_from_the_store_without_the_disassembler(tmp_path):
    store = tmp_path / "code-facts.json"
    first = _read(store)
    assert first["capstone"] and first["name"] == "glibc" and first["places"]
    files = json.loads(store.read_text())["files"]
    assert any(k.startswith("build-id ") and "place malloc 1" in v for k, v in files.items()), files.keys()
    second = _read(store)
    assert not second["capstone"]
    assert {k: v for k, v in second.items() if k != "capstone"} == {k: v for k, v in first.items() if k != "capstone"}


def test_facts_read_by_other_decoders_are_read_again(tmp_path):
    store = tmp_path / "code-facts.json"
    _read(store)
    data = json.loads(store.read_text())
    data["version"] = "00000000"  # as if allocator.py or forwarders.py had changed since
    for facts in data["files"].values():
        for fact in facts:
            if fact.startswith("place malloc"):
                facts[fact] = None  # a wrong answer, which must not be served
    store.write_text(json.dumps(data))
    again = _read(store)
    assert again["capstone"] and any(p[0] == "malloc" for p in again["places"])
    assert json.loads(store.read_text())["version"] != "00000000"


def test_a_mangled_store_is_read_again_never_a_traceback(tmp_path):
    store = tmp_path / "code-facts.json"
    _read(store)
    data = json.loads(store.read_text())
    data["files"] = {k: ["not", "a", "dict"] for k in data["files"]}
    store.write_text(json.dumps(data))
    assert _read(store)["capstone"]  # every fact read again
    store.write_text("{not json")
    assert _read(store)["places"]
