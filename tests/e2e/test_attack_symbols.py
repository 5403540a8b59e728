"""Hostile symbolization inputs against real processes (issue 42): a library whose section headers
are random bytes, mapped and running, must cost its own names and nothing else; a perf map a target
plants as a link to a host file, or as a FIFO, in its own root must give nothing and not block."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memdiag.probes.node.heap import perf_map_state
from memdiag.system.perfmap import read_perf_map

MARKER = "MARKER-4242-HOSTSECRET"

# A library that faults fresh pages from its own code: its frames are on every page fault's stack.
LIBRARY = r"""
#include <string.h>
#include <sys/mman.h>
__attribute__((noinline)) void atk_touch(void) {
    for (int i = 0; i < 16; i++) {
        char *p = mmap(0, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return;
        memset(p, 1, 1 << 20);
        munmap(p, 1 << 20);
    }
}
"""
MAIN = r"""
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    void (*touch)(void) = (void (*)(void))dlsym(h, "atk_touch");
    if (!touch) return 1;
    printf("ready\n");
    fflush(stdout);
    for (;;) { touch(); usleep(20000); }
}
"""


def _corrupt_library(tmp: Path) -> tuple[Path, Path]:
    """(the loader, a copy of the library with every section header overwritten by random bytes):
    the dynamic loader reads program headers only, so it loads and runs."""
    (tmp / "atk.c").write_text(LIBRARY)
    (tmp / "atkmain.c").write_text(MAIN)
    lib, main = tmp / "libatk.so", tmp / "atkmain"
    subprocess.run(["cc", "-O1", "-fno-omit-frame-pointer", "-shared", "-fPIC", "-o", lib, tmp / "atk.c"], check=True)
    subprocess.run(["cc", "-O1", "-fno-omit-frame-pointer", "-o", main, tmp / "atkmain.c", "-ldl"], check=True)
    data = bytearray(lib.read_bytes())
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    entsize, count = struct.unpack_from("<HH", data, 0x3A)
    noise = random.Random(42)
    for i in range(shoff, shoff + entsize * count):
        data[i] = noise.randrange(256)
    corrupt = tmp / "libatk-corrupt.so"
    corrupt.write_bytes(data)
    return main, corrupt


def test_a_corrupt_library_in_a_running_process_costs_its_names_not_the_report(root_required, tmp_path, memdiag):
    """Before: `internal error: ValueError: cannot fit 'int' into an offset-sized integer`, exit 1."""
    main, corrupt = _corrupt_library(tmp_path)
    proc = subprocess.Popen([main, corrupt], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        started = time.monotonic()
        r = memdiag("probe", "faults", "--pid", str(proc.pid), "--duration", "3", timeout=60)
        took = time.monotonic() - started
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    assert "internal error" not in r.stderr and f"PID {proc.pid} (atkmain)" in r.stdout
    # the module's frames are there, unnamed; the other modules' frames keep their names
    assert "[unknown] [libatk-corrupt.so]" in r.stdout and "main+0x" in r.stdout, r.stdout
    assert f"symbols: {corrupt}: no symbols (its headers: " in r.stdout, r.stdout
    assert took < 30


@pytest.fixture
def rooted(root_required, tmp_path):
    """A process in a root of its own (a mount namespace, /usr bound in, chroot): what a container's
    root is to memdiag. Killed at the end; its mounts go with its namespace."""
    root = tmp_path / "root"
    for d in ("usr", "tmp", "etc"):
        (root / d).mkdir(parents=True)
    for link in ("bin", "lib", "lib64"):
        if Path(f"/{link}").is_symlink():
            (root / link).symlink_to(os.readlink(f"/{link}"))
    inner = f"mount --bind /usr {root}/usr && exec chroot {root} /usr/bin/sleep 120"
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", inner])
    try:
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{proc.pid}/root") != str(root):
            assert time.monotonic() < deadline and proc.poll() is None, "the process did not enter its root"
            time.sleep(0.02)
        yield proc.pid, root
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_perf_map_is_read_inside_the_targets_root_and_never_through_its_links(rooted, tmp_path):
    pid, root = rooted
    secret = tmp_path / "host-secret"  # a host file the target cannot read from its root
    secret.write_text(f"7f0000001000 40 {MARKER}\n")
    secret.chmod(0o600)
    own = root / "tmp" / f"perf-{pid}.map"
    # the runtime's own map, in its root: read
    own.write_text("7f0000001000 40 JS:*handleOrder /srv/app.js:17:21\n")
    pm = read_perf_map(pid)
    assert pm is not None and pm.lookup(0x7F0000001010).function() == ("handleOrder", "app.js:17")
    # the map as a link to the host file (before: the marker named a JIT frame)
    own.unlink()
    own.symlink_to(secret)
    assert read_perf_map(pid) is None and perf_map_state(pid) is None
    # the process's /tmp as a link out of its root, to a host folder holding a map of that name
    hostdir = tmp_path / "hostdir"
    hostdir.mkdir()
    (hostdir / f"perf-{pid}.map").write_text(f"7f0000001000 40 {MARKER}\n")
    own.unlink()
    (root / "tmp").rmdir()
    (root / "tmp").symlink_to(hostdir)
    leaked = Path(f"/proc/{pid}/root/tmp/perf-{pid}.map")  # the kernel's own walk leaves the root
    assert leaked.read_text().endswith(f"{MARKER}\n")
    assert read_perf_map(pid) is None and perf_map_state(pid) is None


def test_a_fifo_as_the_perf_map_is_refused_at_once(rooted):
    """Before: open() blocked for good, SIGTERM and SIGINT could not end it. Read in a child, so a
    regression fails here instead of hanging the suite."""
    pid, root = rooted
    os.mkfifo(root / "tmp" / f"perf-{pid}.map")
    code = (
        "import time; from memdiag.system.perfmap import read_perf_map as r; "
        f"t = time.monotonic(); print(r({pid}), time.monotonic() - t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert out.returncode == 0, out.stderr
    found, took = out.stdout.split()
    assert found == "None" and float(took) < 1.0


def test_a_mapped_library_swapped_for_a_fifo_is_read_as_mapped_and_never_blocks(root_required, tmp_path):
    """A library the target maps, then renames away and replaces by a FIFO at its path: memdiag
    resolves the mapping's file by that path (and by the path through the target's root); before,
    the open for a build-id comparison blocked for good. Now the FIFO is passed over and the
    library's names come from the very inode mapped (map_files). Read in a child, so a regression
    fails here instead of hanging the suite."""
    main, _ = _corrupt_library(tmp_path)
    lib = tmp_path / "libatk.so"
    proc = subprocess.Popen([main, lib], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "ready\n", proc.stderr.read()
        code = (  # the maps read, then the swap (as a target does between memdiag's read and its look)
            "import os, time\nfrom memdiag.probes.procmaps import AddressSpace\n"
            "from memdiag.probes.elf import elf_info\n"
            f"space = AddressSpace.of({proc.pid})\n"
            f"m = next(m for m in space.mappings if m.path == {str(lib)!r} and m.executable)\n"
            f"os.rename({str(lib)!r}, {str(lib) + '.moved'!r}); os.mkfifo({str(lib)!r})\n"
            "t = time.monotonic(); path = space.file_path(m); info = elf_info(path)\n"
            "named = info is not None and info.symbol_named('atk_touch') is not None\n"
            "print(path.startswith('/proc/'), named, time.monotonic() - t)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert out.returncode == 0, out.stderr
    via_map_files, named, took = out.stdout.split()
    assert (via_map_files, named) == ("True", "True") and float(took) < 5.0, out.stdout
