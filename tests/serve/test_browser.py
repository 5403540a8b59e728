"""The HTML pages of `memdiag serve`, as a real headless browser (Debian's chromium) renders them."""

import shutil
import subprocess

import pytest


def dump_dom(url: str, profile) -> str:
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/setup.sh --test installs it)")
    r = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def test_incident_pages_in_a_browser(server, workload, tmp_path):
    srv = server()
    w = workload("churn", "1000")
    status, body = srv.post("/diagnose", {"pid": w.pid, "duration": 5})
    assert status == 202
    done = srv.wait(body["id"])
    assert done["state"] == "done"
    listing = dump_dom(srv.url + "/incidents?format=html", tmp_path / "p1")
    assert '<table id="incidents">' in listing
    assert f'href="/incidents/{body["id"]}?format=html"' in listing
    assert f"<td>{done['verdict_kind']}</td>" in listing
    report = dump_dom(srv.url + f"/incidents/{body['id']}?format=html", tmp_path / "p2")
    assert f"<h1>memdiag: {done['verdict_kind']} — PID {w.pid} (churn)</h1>" in report
    assert "<table>" in report and '<h2 id="probes">Probes</h2>' in report
    assert f'<section class="verdict k-{done["verdict_kind"]}" id="verdict">' in report
