"""The shipped Prometheus rules (deploy/prometheus/memdiag-rules.yml): valid for the real promtool,
their unit tests pass (and fail when a rule loses what tells a leak from a sawtooth), and every label
they name as memdiag's target is one memdiag serve reads and accepts in the shape the alert has."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from memdiag.diagnose.serve.targets import BadLabel, NotOnHost, target_from_labels
from memdiag.diagnose.target import Target

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = DEPLOY / "memdiag-rules.yml"
TESTS = DEPLOY / "memdiag-rules.test.yml"

# A value of the right shape that names nothing on this host, per label memdiag reads.
ABSENT = {
    "pid": "999999999",
    "container_id": "containerd://" + "0" * 64,
    "uid": "00000000-0000-4000-8000-000000000000",
    "pod_uid": "00000000-0000-4000-8000-000000000000",
    "id": "/memdiag-test-no-such-cgroup",
}


def _rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def _fired() -> list[dict]:
    """Every alert the promtool tests expect to fire, with exactly its labels."""
    tests = yaml.safe_load(TESTS.read_text())["tests"]
    return [a["exp_labels"] for t in tests for case in t["alert_rule_test"] for a in case["exp_alerts"]]


def _promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.skip("promtool missing: scripts/setup.sh --test installs Debian's prometheus")
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_check_rules_accepts_every_rule():
    done = _promtool("check", "rules", RULES.name, cwd=DEPLOY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_promtool_unit_tests_pass():
    done = _promtool("test", "rules", TESTS.name, cwd=DEPLOY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and "FAILED" not in done.stdout + done.stderr


def test_promtool_unit_tests_fail_when_growth_has_no_floor(tmp_path):
    """Without the size-relative and 64 MiB floors the sawtooth heap fires: the tests see it."""
    text = RULES.read_text()
    assert text.count("> 0.2 * ") == 3 and text.count("> 64 * 1024 * 1024") == 3
    (tmp_path / RULES.name).write_text(text.replace("> 0.2 * ", "> 0 * ").replace("> 64 * 1024 * 1024", "> 0"))
    shutil.copy(TESTS, tmp_path / TESTS.name)
    done = _promtool("test", "rules", TESTS.name, cwd=tmp_path)
    out = done.stdout + done.stderr
    assert done.returncode != 0
    assert 'groupname="gc:4444"' in out and "alertname: MemoryProcessGrowth" in out


def test_every_alert_has_its_annotations_and_target_label():
    for rule in _rules():
        assert {"summary", "description", "memdiag"} <= set(rule["annotations"]), rule["alert"]
        assert "for" in rule, rule["alert"]
        assert rule["labels"]["memdiag_target"], rule["alert"]


def test_target_labels_are_ones_memdiag_reads():
    """Each label named in memdiag_target, alone with a well-formed value, is taken as a target
    (not on this host: 404) where a label memdiag does not read is refused (422)."""
    named = {n for r in _rules() for n in r["labels"]["memdiag_target"].split(",") if n != "none"}
    assert named == {"pid", "id", "container_id", "uid"}
    for name in named:
        with pytest.raises(NotOnHost):
            target_from_labels({name: ABSENT[name]})
    with pytest.raises(BadLabel, match="no label names a target"):
        target_from_labels({"groupname": "leaky", "instance": "host-a:9256"})


def test_fired_alerts_carry_their_target_label_in_a_shape_memdiag_accepts():
    """The labels of each alert the unit tests fire, given whole to memdiag: a target label that
    passes validation (a target, or 404 here), or, for memdiag_target none, the 422 the annotation
    announces."""
    fired = _fired()
    assert {a["alertname"] for a in fired} == {r["alert"] for r in _rules()}
    for labels in fired:
        wanted = labels["memdiag_target"]
        if wanted == "none":
            with pytest.raises(BadLabel, match="no label names a target"):
                target_from_labels(labels)
            continue
        assert all(labels.get(n) for n in wanted.split(",")), labels
        with contextlib.suppress(NotOnHost):  # valid, and not on this host
            assert isinstance(target_from_labels(labels), Target)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _resident(metrics: str) -> dict[str, float]:
    """groupname -> resident bytes, from process-exporter's exposition text."""
    pattern = r'^namedprocess_namegroup_memory_bytes\{groupname="([^"]*)",memtype="resident"\} (\S+)$'
    return {m.group(1): float(m.group(2)) for m in re.finditer(pattern, metrics, re.M)}


def test_real_process_exporter_series_give_the_rule_a_pid(tmp_path):
    """Debian's process-exporter, named "{{.Comm}}:{{.PID}}" as docs/serve.md says, run on loopback:
    the rule's own selector and label_replace regexes (read from the rules file) take the pid of a
    real process from its group name, and memdiag resolves that pid; a "{{.Comm}}" group gives none."""
    exporter = shutil.which("prometheus-process-exporter")
    if exporter is None:
        pytest.skip("prometheus-process-exporter missing: scripts/setup.sh --test installs it")
    expr = next(r["expr"] for r in _rules() if r["alert"] == "MemoryProcessGrowth")
    selector = re.search(r'groupname=~"([^"]+)"', expr).group(1)
    extract = re.search(r'"pid", "\$1", "groupname", "([^"]+)"', expr).group(1)
    config = tmp_path / "process-exporter.yml"
    config.write_text(
        "process_names:\n"
        '  - name: "{{.Comm}}:{{.PID}}"\n'
        "    cmdline: ['^sleep 61\\.25$']\n"
        '  - name: "{{.Comm}}"\n'
        "    cmdline: ['^sleep 61\\.5$']\n"
    )
    one = subprocess.Popen(["sleep", "61.25"])
    many = subprocess.Popen(["sleep", "61.5"])
    port = _free_port()
    proc = subprocess.Popen(
        [exporter, f"-web.listen-address=127.0.0.1:{port}", f"-config.path={config}", "-threads=false"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        series: dict[str, float] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None and len(series) < 2:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    series = _resident(r.read().decode())
            except OSError:
                pass
            time.sleep(0.2)
        said = proc.stderr.read().decode() if proc.poll() is not None else series
        assert set(series) == {f"sleep:{one.pid}", "sleep"}, said
        assert series[f"sleep:{one.pid}"] > 0
        assert re.fullmatch(selector, f"sleep:{one.pid}") and not re.fullmatch(selector, "sleep")
        pid = re.fullmatch(extract, f"sleep:{one.pid}").group(1)
        assert target_from_labels({"pid": pid, "groupname": f"sleep:{one.pid}"}).pid == one.pid
        with pytest.raises(BadLabel, match="no label names a target"):
            target_from_labels({"groupname": "sleep"})
    finally:
        for p in (proc, one, many):
            p.kill()
            p.wait(timeout=10)
