"""serve's incidents say what runtime the diagnosed target runs: a Go program built here, its
version and module, as the report's Runtime line says it."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kit import go_version  # noqa: E402


def test_an_incident_of_a_go_program_names_its_runtime(servers, workload, tmp_path):
    w = workload("goerrmap", "50")
    srv = servers(tmp_path / "data", duration=2)
    status, body = srv.post("/diagnose", {"pid": w.pid})
    assert status == 202, body
    done = srv.wait(body["id"], timeout=120)
    assert done["state"] == "done", done
    assert done["runtime"] == f"Go {go_version()[2:]} ({w.binary}; module memdiag.test/workloads/goerrmap)"
    md = srv.get(f"/incidents/{body['id']}?format=md")[1].decode()
    assert f"- Runtime: {done['runtime']}" in md
