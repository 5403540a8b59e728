"""The whole alert loop with real components on this machine: a leaking workload, Debian's
process-exporter naming it "{{.Comm}}:{{.PID}}", Debian's Prometheus evaluating the shipped rules
(on a clock 180 times faster: tests/loop.py), the real Alertmanager routing with the shipped
receiver's matchers, and `memdiag serve`, whose incident names the leaking function. The latency
from the first sample of growth to the alert, the incident and the verdict is printed and, with
MEMDIAG_LOOP_TIMINGS=FILE, appended to FILE as one JSON line (scripts/bench.sh loop)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml
from kit import build
from loop import (
    LEAK_KIB_S,
    RULES,
    SPEED_UP,
    Prometheus,
    get_text,
    process_exporter,
    receiver_config,
    scaled_rules,
    time_changes,
)
from serve.conftest import alertmanager, free_port, server  # noqa: F401 (fixtures shared with tests/serve)

# process-exporter exports every process of the kit's leak and churn, whichever test runs it: the
# machine to itself
pytestmark = pytest.mark.alone

ALERT = "MemoryProcessGrowth"


def test_test_speed_rules_differ_from_the_shipped_ones_only_in_time():
    shipped = RULES.read_text()
    changes = time_changes(shipped, scaled_rules(shipped))
    assert set(changes) == {
        ("30m", "10s"),
        ("15m", "5s"),
        ("3600", "20"),
        ("10m", "3333ms"),
        ("5m", "1667ms"),
        ("0m", "0s"),
    }
    assert SPEED_UP == 180
    fast = {r["alert"]: r for g in yaml.safe_load(scaled_rules(shipped))["groups"] for r in g["rules"]}
    slow = {r["alert"]: r for g in yaml.safe_load(shipped)["groups"] for r in g["rules"]}
    assert fast.keys() == slow.keys() and all(fast[a]["labels"] == slow[a]["labels"] for a in slow)
    assert fast[ALERT]["for"] == "5s" and slow[ALERT]["for"] == "15m"
    assert fast[ALERT]["expr"].count("[10s]) * 20") == 2 and fast[ALERT]["expr"].count("> 64 * 1024 * 1024") == 1


def _wait_for(what: str, get, timeout: float, context):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := get():
            return found
        time.sleep(0.25)
    raise AssertionError(f"no {what} within {timeout:.0f} s; {context()}")


def test_leak_goes_exporter_prometheus_alertmanager_memdiag_to_its_function(server, alertmanager, workload, tmp_path):  # noqa: F811
    for tool in ("prometheus", "prometheus-process-exporter", "prometheus-alertmanager"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing: scripts/setup.sh --test installs it")
    rules = tmp_path / "memdiag-rules.yml"
    rules.write_text(scaled_rules(RULES.read_text()))
    assert time_changes(RULES.read_text(), rules.read_text())  # the shipped rules, only faster
    srv = server(extra=["--no-oom-watch"])  # the watch is host-wide: another test's OOM kill is an incident too
    hook = srv.url + "/alerts/alertmanager"
    am = alertmanager(hook, config=receiver_config(hook, srv.token_file))
    with (
        process_exporter(tmp_path, free_port(), [build("leak"), build("churn")]) as exporter,
        Prometheus(tmp_path, free_port(), exporter, rules, am.removeprefix("http://")) as prom,
    ):
        steady = workload("churn", "1000")  # named "churn:PID" too: flat, so no alert
        started = time.time()
        w = workload("leak", str(LEAK_KIB_S))
        alerts = f"{prom.url}/api/v1/alerts"
        incident = _wait_for("incident", srv.incidents, 60, lambda: f"Prometheus's alerts: {get_text(alerts)}")[0]
        done = srv.wait(incident["id"], timeout=60)
        fired = prom.first_firing(ALERT)
        growth = prom.first_growth(
            f'namedprocess_namegroup_memory_bytes{{groupname="leak:{w.pid}",memtype="resident"}}'
        )
        flat = prom.query(f'ALERTS{{groupname="churn:{steady.pid}"}}')
    assert len(srv.incidents()) == 1, srv.incidents()  # one alert, one incident; the flat process none
    assert flat == []
    ((firing, labels),) = fired
    assert labels["pid"] == str(w.pid) and labels["groupname"] == f"leak:{w.pid}"
    assert labels["memdiag_target"] == "pid" and labels["node"] == "127.0.0.1"
    assert incident["source"] == "alertmanager" and incident["target"]["pid"] == w.pid
    assert incident["alert"]["labels"]["alertname"] == ALERT and incident["alert"]["labels"]["pid"] == str(w.pid)
    # (host-wide pressure outranks growth in the playbook: another job swapping on the same machine
    # turns the verdict into "pressure", said here with the host's PSI)
    psi = Path("/proc/pressure/memory").read_text().replace("\n", "; ")
    said = f"{done['state']}: {done['verdict_kind']}: {done['summary']} (host memory PSI: {psi})"
    assert done["state"] == "done" and done["verdict_kind"] in ("leak", "growth"), said
    assert "leak_order_history" in done["summary"], done["summary"]
    md = srv.get(f"/incidents/{incident['id']}?format=md")[1].decode()
    assert md.startswith(f"# memdiag: {done['verdict_kind']} — PID {w.pid} (leak)")
    created, verdict = incident["created"], done["updated"]
    assert growth is not None and started < growth < firing < created < verdict, (
        started,
        growth,
        firing,
        created,
        verdict,
    )
    timings = {
        "start_to_growth_s": growth - started,
        "growth_to_firing_s": firing - growth,
        "growth_to_incident_s": created - growth,
        "growth_to_verdict_s": verdict - growth,
        "firing_to_incident_s": created - firing,
        "diagnosis_s": verdict - created,
        "verdict_kind": done["verdict_kind"],
        "summary": done["summary"],
    }
    print("alert loop:", json.dumps(timings))
    if out := os.environ.get("MEMDIAG_LOOP_TIMINGS"):
        with open(out, "a") as f:
            f.write(json.dumps(timings) + "\n")
