"""The shipped Prometheus rules (deploy/prometheus/memdiag-rules.yml): valid for the real promtool,
their unit tests pass (and fail when a rule loses what tells a leak from a sawtooth), and every label
they name as memdiag's target is one memdiag serve reads and accepts in the shape the alert has."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
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
