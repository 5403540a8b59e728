"""The --data folder of `memdiag serve` against other users and planted links: real folders owned
by another uid, loose modes above it, the cgroup filesystem, and a `reports` link planted while the
server runs (and while it is stopped)."""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

from conftest import free_port, request
from kit import memory_cgroup_root

NOBODY = 65534


def _refused(memdiag, data: Path) -> str:
    r = memdiag("serve", "--no-oom-watch", "--data", str(data), "--listen", f"127.0.0.1:{free_port()}", timeout=30)
    assert r.returncode == 2 and "listening on" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_data_folder_another_user_could_change_is_refused_with_one_line(memdiag, root_required, tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)  # accepted before: that user swapped `reports` for a link, root wrote through it
    line = _refused(memdiag, theirs)
    assert line == (
        f"memdiag: --data {theirs}: refusing a data folder owned by uid {NOBODY} (nobody): its owner could "
        "plant links that memdiag would write through; name a new folder (memdiag creates it, mode 700) or one "
        "owned by root"
    )
    assert os.listdir(theirs) == []  # refused before anything was made in it
    line = _refused(memdiag, theirs / "data")  # a folder above it theirs: they could swap `data` itself
    assert f"{theirs} above it is owned by uid {NOBODY} (nobody), who could swap the folders below it" in line
    assert os.listdir(theirs) == []
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    line = _refused(memdiag, shared / "a" / "data")
    assert f"{shared} above it can be written by others (mode 777)" in line and f"chmod go-w {shared}" in line
    assert os.listdir(shared) == []
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o770)
    assert "refusing a data folder others can write to (mode 770)" in _refused(memdiag, loose)
    link = tmp_path / "link"
    link.symlink_to(loose)
    assert _refused(memdiag, link) == f"memdiag: --data {link}: is a symbolic link; name the folder itself ({loose})"


def test_a_folder_under_a_sticky_shared_folder_is_used(servers, tmp_path):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)  # as /tmp: only an entry's owner may rename or remove it
    srv = servers(sticky / "data", duration=1)
    assert srv.health()["ok"] is True
    assert stat.S_IMODE((sticky / "data").stat().st_mode) == 0o700 and (sticky / "data" / "reports").is_dir()


def test_data_under_the_cgroup_filesystem_exits_2_and_makes_no_cgroup(memdiag, root_required):
    _version, mount = memory_cgroup_root()
    folder = mount / f"memdiag-test-{uuid.uuid4().hex[:8]}"
    try:
        line = _refused(memdiag, folder)
        assert line.startswith(f"memdiag: --data {folder}: on the cgroup") and "name a folder on a disk" in line
        assert not folder.exists()  # before: the mkdir made a memory cgroup, left behind by the exit
    finally:
        if folder.exists():
            folder.rmdir()


def test_a_reports_link_planted_while_the_server_runs_is_never_written_through(servers, sleeper, tmp_path):
    data = tmp_path / "data"
    srv = servers(data, duration=1)
    pid = sleeper()
    status, body = srv.post("/diagnose", {"pid": pid})
    first = srv.wait(body["id"])
    assert first["state"] == "done"
    outside = tmp_path / "outside"
    outside.mkdir()
    os.rename(data / "reports", data / "reports.before")
    (data / "reports").symlink_to(outside)
    status, body = srv.post("/diagnose", {"pid": pid})
    failed = srv.wait(body["id"])
    assert failed["state"] == "failed", failed
    why = f"{data}/reports was replaced by a symbolic link while the server runs: not followed"
    assert failed["error"].startswith(f"writing the report: {why}"), failed["error"]
    assert os.listdir(outside) == []  # before: five report files written there, as root
    status, raw = request(srv.url + "/healthz", token=None)
    assert status == 503 and why in json.loads(raw)["reason"]
    status, raw = srv.get(f"/incidents/{first['id']}?format=md")  # nor read through it
    assert status == 410 and why in json.loads(raw)["error"]
    srv.stop()
    # planted while the server is stopped: the link is removed at start, a folder made in its place
    srv.start()
    assert (data / "reports").is_dir() and not (data / "reports").is_symlink()
    status, body = srv.post("/diagnose", {"pid": pid})
    assert srv.wait(body["id"])["state"] == "done"
    assert (data / "reports" / body["id"] / "report.md").is_file()
    assert os.listdir(outside) == [] and srv.health()["ok"] is True
