"""Runtime recognition of real processes on this machine: Node, every JDK installed, CPython, Go
programs built here (plain and stripped) and the distribution's Go binaries, each version checked
against what the runtime's own tool says of itself (node --version, the JDK's java.version
property, `go version`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from memdiag.probes.registry import REGISTRY
from memdiag.system.runtime import read_go_build

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kit import go_version  # noqa: E402

JDKS = sorted(p for p in Path("/usr/lib/jvm").glob("*") if (p / "bin" / "java").exists() and not p.is_symlink())
DEBIAN_GO = ["/usr/bin/prometheus", "/usr/bin/prometheus-process-exporter", "/usr/bin/podman"]  # setup.sh --test
SLEEPER = "public class Sleeper { public static void main(String[] a) throws Exception {"
SLEEPER += ' System.out.println("ready"); Thread.sleep(60000); } }'


def _started(argv: list[str]) -> subprocess.Popen:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = proc.stdout.readline().decode()
    assert line.startswith("ready"), (argv, line)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()
    proc.stdout.close()


def test_node_and_its_versions(workload):
    w = workload("nodeleak", "20")
    r = REGISTRY.recognise(w.pid)
    node = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True).stdout.strip()
    v8 = subprocess.run(["node", "-p", "process.versions.v8"], capture_output=True, text=True, check=True)
    assert (r.name, r.version, r.module) == ("node", node.removeprefix("v"), str(w.binary))
    assert r.detail == f"V8 {v8.stdout.strip()}"


@pytest.mark.parametrize("home", JDKS, ids=[p.name for p in JDKS])
def test_each_jdk_and_its_version(root_required, tmp_path, home):
    src = tmp_path / "Sleeper.java"
    src.write_text(SLEEPER)
    java = str(home / "bin" / "java")
    settings = subprocess.run([java, "-XshowSettings:properties", "-version"], capture_output=True, text=True)
    said = re.search(r"^\s*java\.version = (\S+)$", settings.stderr, re.M)[1]
    proc = _started([java, "-Xmx32m", str(src)])
    try:
        r = REGISTRY.recognise(proc.pid)
    finally:
        _stop(proc)
    assert (r.name, r.version, r.module) == ("jvm", said, str(home / "lib" / "server" / "libjvm.so"))


def test_cpython(root_required):
    proc = _started(["/usr/bin/python3", "-c", "import time; print('ready', flush=True); time.sleep(60)"])
    try:
        r = REGISTRY.recognise(proc.pid)
    finally:
        _stop(proc)
    # the exact version, from the Py_Version the interpreter exports (3.11+): as it says of itself
    said = subprocess.run(["/usr/bin/python3", "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert (r.name, r.version) == ("cpython", said)


@pytest.mark.parametrize("planted", ["fifo", "link"])
def test_a_mapped_binary_replaced_after_the_start_is_read_as_mapped(root_required, tmp_path, planted):
    """The interpreter's file swapped, after it started, for a FIFO (open would block memdiag for
    good) or a link to another file (a host file's bytes read as the target's): the version is read
    from the inode the process maps (map_files), at once, never from what its path names now."""
    exe = tmp_path / "python3.11"
    exe.write_bytes(Path("/usr/bin/python3.11").read_bytes())
    exe.chmod(0o755)
    proc = _started([str(exe), "-c", "import time; print('ready', flush=True); time.sleep(60)"])
    decoy = tmp_path / "decoy"
    try:
        if planted == "fifo":
            os.mkfifo(decoy)
        else:
            decoy.symlink_to("/usr/bin/true")
        os.replace(decoy, exe)
        found: list = []
        reader = threading.Thread(target=lambda: found.append(REGISTRY.recognise(proc.pid)), daemon=True)
        reader.start()
        reader.join(timeout=10)
    finally:
        _stop(proc)
    assert found, "recognition did not return within 10 s (blocked on the planted file)"
    said = subprocess.run(["/usr/bin/python3.11", "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert (found[0].name, found[0].version) == ("cpython", said)


@pytest.mark.parametrize("flags", [[], ["-ldflags=-s -w"]], ids=["plain", "stripped"])
def test_a_go_program_built_here(workload, flags):
    w = workload("goerrmap", "20", flags=flags)
    r = REGISTRY.recognise(w.pid)
    assert (r.name, r.version, r.module) == ("go", go_version().removeprefix("go"), str(w.binary))
    assert r.detail == "module memdiag.test/workloads/goerrmap"
    assert r.describe() == f"Go {r.version} ({w.binary}; module memdiag.test/workloads/goerrmap)"


@pytest.mark.parametrize("path", DEBIAN_GO)
def test_the_distributions_go_binaries(root_required, path):
    said = subprocess.run(["go", "version", "-m", path], capture_output=True, text=True, check=True).stdout
    version = said.splitlines()[0].split(": ", 1)[1]
    module = re.search(r"^\tpath\t(\S+)$", said, re.M)[1]
    b = read_go_build(Path(path))
    assert (b.version, b.main_module) == (version, module)


def test_a_native_program_is_none(workload):
    w = workload("leak", "64")
    assert REGISTRY.recognise(w.pid) is None
