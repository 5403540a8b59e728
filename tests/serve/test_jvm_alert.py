"""An alert on a JVM container, as cAdvisor or kube-state-metrics would label it: memdiag serve
finds the container's largest process, the JVM, and diagnoses it with the JVM's own instruments."""

from __future__ import annotations

import json

import pytest
from jvmkit import have_jdk, wait_warmed_up

pytestmark = [
    pytest.mark.skipif(not have_jdk(), reason="needs a JDK (scripts/setup.sh --test installs openjdk-17)"),
    # its JVMs' recording and histogram costs are measured and kept (probes/jvm/costs.py): run alone
    pytest.mark.alone,
]


def test_an_alert_on_a_jvm_container_diagnoses_the_jvm_inside_it(server, jvm_container):
    c = jvm_container("OrderService", "1000", jvm=("-Xmx512m",))
    wait_warmed_up(c.pid)
    # a budget that pays for JFR's first start in a JVM in this window (about a second here)
    srv = server(duration=30, extra=["--no-oom-watch", "--budget", "10"])
    alert = {"alerts": [{"status": "firing", "labels": {"alertname": "MemoryContainerGrowth", "container_id": c.id},
                         "startsAt": "2026-12-01T06:00:00Z", "fingerprint": "a11"}]}  # fmt: skip
    status, body = srv.post("/alerts/alertmanager", alert)
    assert status == 202, body
    incident = srv.wait(body["incidents"][0]["id"], timeout=180)
    assert incident["state"] == "done", incident
    rep = json.loads(srv.get(f"/incidents/{incident['id']}?format=json")[1])
    v = rep["verdict"]
    assert v["culprit"]["pid"] == c.pid
    assert v["kind"] == "growth" and "held by OrderService.retryQueue" in v["summary"], v["summary"]
    assert any(s["title"] == "Java heap: what holds it" for s in rep["sections"])
