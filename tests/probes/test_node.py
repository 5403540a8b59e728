"""Node.js targets on this machine's Node: V8's heap against memory outside it read from smaps,
checked against what Node says of itself (process.memoryUsage()); JavaScript frames named in
memleak's native stacks through the perf map `node --perf-basic-prof` writes, also from a private
/tmp in a pid namespace of its own; and without a perf map, frames left unnamed."""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memdiag.diagnose.culprit import default_classes
from memdiag.probes import memleak
from memdiag.probes.node.heap import run as nodeheap
from memdiag.system.perfmap import read_perf_map
from memdiag.system.process import innermost_pid
from memdiag.system.target import Target
from memdiag.system.v8memory import read_v8_memory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kit import SOURCES  # noqa: E402

MiB = 1 << 20
PERF = ["--perf-basic-prof"]


def _own_frames(r) -> list[list[str]]:
    return [s.frames for s in r.stacks if any("nodeleak.js" in f for f in s.frames)]


def _latest(stream) -> dict:
    """The line the program printed last (those before it wait in the pipe), once the next is out."""
    fd = stream.fileno()
    os.set_blocking(fd, False)
    buffered = b""
    while not buffered.endswith(b"\n") or select.select([fd], [], [], 0)[0]:
        select.select([fd], [], [], 2)
        buffered += os.read(fd, 1 << 16)
    return json.loads(buffered.splitlines()[-1])


def test_the_split_is_what_node_says_of_itself(workload):
    w = workload("nodeheap", "4000", "200")
    time.sleep(5)
    said = _latest(w.proc.stdout)
    m = read_v8_memory(w.pid)
    # V8's committed heap is its heapTotal (read a second apart at most: it moves by pages)
    assert abs(m.v8_mapped - said["heapTotal"]) <= 0.1 * said["heapTotal"] + 2 * MiB, (m, said)
    assert said["heapUsed"] * 0.8 <= m.v8_resident <= m.v8_mapped
    # the Buffers' contents (zero-filled, so resident) are outside it, malloc'd
    assert m.native_resident >= 0.9 * said["arrayBuffers"] > 8 * MiB, (m, said)


def test_a_node_leak_names_the_javascript_function_with_a_perf_map(workload):
    w = workload("nodeleak", "200", "3", flags=PERF)
    time.sleep(3)  # V8 compiles the hot functions to code the perf map names
    r = memleak.run(Target.for_pid(w.pid), 6)
    assert r.status == "ok", r.reason
    own = _own_frames(r)  # heaviest outstanding first: the kept copies
    assert own, [s.frames[:12] for s in r.stacks[:3]]
    # rememberFailure while V8 runs it as its own code, handleOrder once TurboFan inlined it there:
    # a perf map names the function whose code it is, the outermost of what V8 inlined
    culprit = default_classes().name(own[0]).function
    defined = {"rememberFailure": 11, "handleOrder": 17}
    assert culprit in defined, own[0]
    assert f"{culprit} (JS function at nodeleak.js:{defined[culprit]}) [perf-{w.pid}.map]" in own[0]
    h = nodeheap(Target.for_pid(w.pid), 4)
    assert h.perf_map == f"/tmp/perf-{w.pid}.map" and h.perf_map_bytes > 0


def test_without_a_perf_map_javascript_frames_stay_unnamed(workload):
    w = workload("nodeleak", "200", "3")
    time.sleep(3)
    r = memleak.run(Target.for_pid(w.pid), 5)
    assert r.status == "ok", r.reason
    top = r.stacks[0]
    assert "[unknown] [[anon]]" in top.frames and not any("JS function" in f for f in top.frames)
    named = default_classes().name(top.frames)  # Node's own frames are passed over, the JIT's unnamed
    assert (named.function, named.label) == (None, "unnamed JIT-compiled code (no perf map)")
    h = nodeheap(Target.for_pid(w.pid), 6)
    assert h.status == "ok" and h.perf_map is None and "started without --perf-basic-prof" in h.reason
    # the kept Buffers grow outside V8's heap
    assert h.native_resident[-1] - h.native_resident[0] > 2 * (h.v8_mapped[-1] - h.v8_mapped[0]), h


def test_a_perf_map_in_a_private_tmp_of_a_pid_namespace(root_required):
    """The map is read where the process wrote it: its own /tmp (a tmpfs of its mount namespace,
    not the host's), named by its pid in its own pid namespace."""
    # the script and V8's isolate log (written in the working folder) live outside /tmp, which the
    # tmpfs hides: a checkout under /tmp (a clone in a mktemp -d folder) lost its script this way
    home = Path(tempfile.mkdtemp(prefix="memdiag-node-", dir="/var/tmp"))
    script = Path(shutil.copy(SOURCES / "nodeleak.js", home))
    inner = f"mount -t tmpfs none /tmp && exec node --perf-basic-prof {script} 200 3"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount", "--propagation", "private", "sh", "-c", inner],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=home,
    )
    node = None
    try:
        assert proc.stdout.readline().startswith(b"ready")
        node = int(Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()[0])
        ns_pid = innermost_pid(Path(f"/proc/{node}/status").read_text())
        assert ns_pid != node
        time.sleep(3)
        pm = read_perf_map(node)
        assert pm is not None and pm.path == f"/proc/{node}/root/tmp/perf-{ns_pid}.map"
        assert not Path(f"/tmp/perf-{node}.map").exists()  # nothing of it in the host's /tmp
        r = memleak.run(Target.for_pid(node), 5)
        own = _own_frames(r)
        assert own and any(f.endswith(f" [perf-{ns_pid}.map]") for f in own[0]), [s.frames[:12] for s in r.stacks]
    finally:
        if node is not None:  # the namespace's first process: killing it ends the namespace (and its /tmp)
            with contextlib.suppress(ProcessLookupError):
                os.kill(node, signal.SIGKILL)
        proc.kill()
        proc.wait()
        shutil.rmtree(home, ignore_errors=True)
