"""`memdiag probe NAME`: one probe alone from the command line, text and JSON, interrupted
cleanly, bad input refused in one line."""

import json
import signal
import subprocess
import time

import pytest
from kit import MEMDIAG, wait_for_line


def test_probe_memleak_json(memdiag, workload, tmp_path):
    w = workload("leak", "2048")
    folded = tmp_path / "leak.folded"
    r = memdiag("probe", "memleak", "--pid", str(w.pid), "--duration", "3", "--json", "--folded", str(folded))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["name"] == "memleak" and data["status"] == "ok"
    assert "leak_order_history" in data["stacks"][0]["functions"]
    assert data["cost"]["events"] > 0
    lines = folded.read_text().splitlines()
    assert lines and "leak_order_history" in lines[0] and lines[0].rsplit(" ", 1)[1].isdigit()


def test_probe_faults_text(memdiag, workload):
    w = workload("leak", "4096")
    r = memdiag("probe", "faults", "--pid", str(w.pid), "--duration", "2", "--top", "1")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "faults: ok"
    assert any("leak_order_history (leak.c:" in line and "[leak]" in line for line in out), out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_probe_interrupted_by_a_signal_still_reports(root_required, workload, sig):
    w = workload("leak", "4096")
    p = subprocess.Popen(
        [MEMDIAG, "probe", "faults", "--pid", str(w.pid), "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_line(p, "memdiag probe faults: attached")  # the probe has a 60 s window
        time.sleep(2)  # the leak faults under the probe for a measured while before the signal
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 128 + sig, err  # the shell's code for the signal, after the report
    assert out.startswith("faults: ok") and "leak_order_history" in out
    assert "  interrupted: stopped by a signal before the end of its window" in out.splitlines()
    assert "Traceback" not in err


def test_probe_bad_input(memdiag, root_required):
    r = memdiag("probe", "memleak", "--pid", "4194304", "--duration", "1")  # no pid reaches PID_MAX_LIMIT
    assert r.returncode == 2 and "no such process" in r.stderr and "Traceback" not in r.stderr
    r = memdiag("probe", "memleak", "--pid", "1", "--min-size", "lots")
    assert r.returncode == 2 and "is not a size" in r.stderr
    r = memdiag("probe", "swapin", "--cgroup", "/not/a/cgroup")
    assert r.returncode == 2 and "is not a memory cgroup" in r.stderr
