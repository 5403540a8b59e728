"""SIGINT and SIGTERM at a phase of `memdiag --pid N` and `memdiag probe`: everything detached, a
partial report that names the signal and the phase, exit 130 or 143. Readiness comes from memdiag's
own progress line (on a pseudo-terminal) and from the target's code itself: a uprobe is a
breakpoint byte (0xCC) written into the target's copy of the library, so its presence says a probe
is attached and its absence after memdiag exits says nothing was left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from figures import read_report
from kit import MEMDIAG, Tty, wait_for_line


def breakpoints(pid: int) -> int:
    """Bytes of the target's executable mappings that differ from their files: uprobes in place."""
    patched = 0
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            parts = line.split()
            if len(parts) < 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in parts[0].split("-"))
            with open(f"/proc/{pid}/root{parts[5]}", "rb") as f:
                f.seek(int(parts[2], 16))
                on_disk = f.read(end - start)
            mem.seek(start)
            in_memory = mem.read(len(on_disk))
            patched += sum(a != b for a, b in zip(on_disk, in_memory, strict=True) if a != b)
    return patched


def status(pid: int) -> dict[str, str]:
    text = Path(f"/proc/{pid}/status").read_text()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in text.splitlines())}


def _until(check, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"not {what} within {timeout} s"
        time.sleep(0.05)


def test_sigint_while_memleak_is_attached_twice_detaches_and_writes_a_partial_report(workload, tmp_path):
    _sigint_while_memleak_attaches(workload, tmp_path)


@pytest.mark.alone  # it keeps every CPU of the host busy
def test_sigint_while_memleak_attaches_on_a_busy_host_still_writes_the_partial_report(workload, tmp_path):
    """Every CPU busy (Debian's stress-ng, a worker per CPU): a signal landing while the kernel
    verifies one of memdiag's programs makes the verifier give up (EAGAIN). That was taken for a
    refusal of uprobe links, and each probe was attached again one by one (a load and a grace
    period each), past the 0.6 s the main thread has to show it saw the signal: the command ended
    without its report (4 runs of 4 here). Now the attaching ends at the signal, and the report is
    written."""
    load = subprocess.Popen(
        ["stress-ng", "--cpu", "0", "--timeout", "300"], stdout=subprocess.DEVNULL, start_new_session=True
    )
    try:
        _sigint_while_memleak_attaches(workload, tmp_path)
    finally:
        os.killpg(load.pid, signal.SIGKILL)  # its workers too
        load.wait()


def _sigint_while_memleak_attaches(workload, tmp_path: Path) -> None:
    w = workload("leak", "2048")
    assert breakpoints(w.pid) == 0
    m = Tty("--pid", str(w.pid), "--duration", "40", "--budget", "20", "--output", str(tmp_path))
    try:
        m.wait_for("probe memleak for", 60)  # the engine's step: pricing is done, memleak attaches next
        _until(lambda: breakpoints(w.pid) > 0, 30, "attached")
        m.proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
        m.proc.send_signal(signal.SIGINT)  # a second one while it detaches and reports changes nothing
        code, out = m.finish()
    finally:
        m.kill()
    assert code == 130, m.text[-800:]
    assert "Traceback" not in m.text
    assert "interrupted by SIGINT during probe memleak; partial report:" in m.text
    # nothing of memdiag's is left in the target: no breakpoint, no tracer, not stopped, still leaking
    assert breakpoints(w.pid) == 0
    st = status(w.pid)
    assert st["TracerPid"] == "0" and st["State"][0] in "RS", st
    rep = read_report(tmp_path)
    cut = rep["interrupted"]
    assert cut["signal"] == "SIGINT" and cut["phase"] == "probe memleak", cut
    assert any(n.startswith("memleak: stopped after") for n in cut["not_gathered"]), cut
    assert any("reachability scan" in n for n in cut["not_gathered"]), cut
    assert any(n.startswith("the counters after") for n in cut["not_gathered"]), cut
    v = rep["verdict"]
    assert v["summary"].startswith("PARTIAL: interrupted by SIGINT during probe memleak") and v["confidence"] <= 0.5
    ml = next(p for p in rep["probes"] if p["name"] == "memleak")
    assert ml["duration_s"] < 30
    assert rep["window"]["ended"] - rep["window"]["started"] < 35
    md = (tmp_path / "report.md").read_text()
    assert md.splitlines()[0].startswith("# memdiag: ") and "(partial: interrupted)" in md.splitlines()[0]
    assert "- **Interrupted** by SIGINT during probe memleak" in md
    assert out.splitlines()[-1] == f"report: {tmp_path / 'report.md'}"


def test_sigterm_in_the_counters_phase_writes_a_partial_report(workload, tmp_path):
    w = workload("leak", "2048")
    m = Tty("--pid", str(w.pid), "--duration", "30", "--output", str(tmp_path))
    try:
        m.wait_for("sampling counters  2.0 s elapsed", 30)
        sent = time.monotonic()
        m.proc.send_signal(signal.SIGTERM)
        code, _ = m.finish()
        took = time.monotonic() - sent
    finally:
        m.kill()
    assert code == 143, m.text[-800:]
    assert took < 5, took
    assert "interrupted by SIGTERM during counters (first look); partial report:" in m.text
    rep = read_report(tmp_path)
    cut = rep["interrupted"]
    assert cut["signal"] == "SIGTERM" and cut["phase"] == "counters (first look)" and 2 <= cut["at_s"] < 10
    assert cut["not_gathered"][0].startswith("the counters after "), cut
    assert rep["verdict"]["summary"].startswith("PARTIAL: interrupted by SIGTERM during counters (first look)")
    assert rep["verdict"]["confidence"] <= 0.5
    assert all(p["status"] == "not-run" for p in rep["probes"])  # no probe was attached
    assert rep["window"]["ended"] - rep["window"]["started"] < 10
    assert "the window was cut short by an interrupt; trends cover less time than asked" in rep["caveats"]
    assert breakpoints(w.pid) == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_probe_command_interrupted_reports_and_exits_by_the_signal(workload, sig):
    w = workload("leak", "4096")
    p = subprocess.Popen(
        [MEMDIAG, "probe", "memleak", "--pid", str(w.pid), "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(p, "memdiag probe memleak: attached")
        assert breakpoints(w.pid) > 0  # its uprobes are in the target
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, err
    assert out.startswith("memleak: ok")  # what it saw until the signal (perhaps nothing yet)
    assert "  interrupted: stopped by a signal before the end of its window" in out.splitlines()
    assert err.strip() == f"memdiag: interrupted by {signal.Signals(sig).name} during probe memleak"
    assert breakpoints(w.pid) == 0


def test_sigint_during_the_reach_scan_releases_the_stopped_target(workload):
    w = workload("bigheap", "512")  # half a GiB to read: the scan holds the target a while
    p = subprocess.Popen(
        [MEMDIAG, "probe", "reach", "--pid", str(w.pid), "--duration", "3", "--max-pause", "60000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _until(lambda: status(w.pid)["TracerPid"] != "0", 60, "stopped by the scan")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err
    attached, cut = err.strip().splitlines()[:2]
    assert attached == "memdiag probe reach: attached", err
    assert cut.startswith("memdiag: interrupted by SIGINT during reach scan"), err
    assert "interrupted: the target was resumed and nothing is concluded from a partial scan" in out
    st = status(w.pid)
    assert st["TracerPid"] == "0" and st["State"][0] in "RS", st
    assert breakpoints(w.pid) == 0


def test_sigterm_during_the_diagnosis_reach_scan_releases_the_target(workload, tmp_path):
    w = workload("bigheap", "512")
    p = subprocess.Popen(
        [MEMDIAG, "--pid", str(w.pid), "--duration", "15", "--budget", "50", "--max-pause", "60000",
         "--output", str(tmp_path), "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        _until(lambda: status(w.pid)["TracerPid"] != "0", 60, "stopped by the scan")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert "interrupted by SIGTERM during reach scan" in err
    st = status(w.pid)
    assert st["TracerPid"] == "0" and st["State"][0] in "RS", st
    assert breakpoints(w.pid) == 0
    rep = read_report(tmp_path)
    cut = rep["interrupted"]
    assert cut["signal"] == "SIGTERM" and cut["phase"].startswith("reach scan"), cut
    assert any("reachability scan" in n for n in cut["not_gathered"]), cut
    scan = next(t for t in rep["trail"] if t["kind"] == "scan")
    assert scan["state"] == "failed" and "interrupted: the target was resumed" in scan["reason"], scan
    assert rep["verdict"]["summary"].startswith("PARTIAL: interrupted by SIGTERM during reach scan")
