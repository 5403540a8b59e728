"""Shared memory's makers on the real kernel. `memdiag probe shmwriter`: what its program keys a made
file by (its path with the folder a relative path is relative to) and what is counted as still there
(a file there before the trace, opened again with O_CREAT, is not one the target made). A diagnosis
of a target in an IPC namespace of its own says its System V segments are not read."""

import json
import os
import subprocess
import sys

from kit import wait_for_line, wait_until

# Every 0.1 s: job-N.spool made by the same relative name in two folders through their
# descriptors, and tmp-N.part made in both and unlinked from the first; then the file old.spool,
# there before the trace, opened again with O_CREAT (a consumer's open(path, "a")).
MAKER = """
import os, sys, time
a = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
b = os.open(sys.argv[2], os.O_RDONLY | os.O_DIRECTORY)
print("ready", file=sys.stderr, flush=True)
n = 0
while True:
    for d in (a, b):
        for name in (f"job-{n}.spool", f"tmp-{n}.part"):
            fd = os.open(name, os.O_CREAT | os.O_WRONLY, 0o600, dir_fd=d)
            os.write(fd, b"x" * 4096)
            os.close(fd)
    os.unlink(f"tmp-{n}.part", dir_fd=a)
    os.close(os.open(os.path.join(sys.argv[1], "old.spool"), os.O_CREAT | os.O_WRONLY | os.O_APPEND))
    n += 1
    time.sleep(0.1)
"""


def _places(data: dict) -> dict[str, int]:
    return {p["where"]: p["remaining"] for p in data["places"]}


def test_a_relative_name_in_two_folders_is_two_files(memdiag, shm_dir, tmp_path):
    """Two folders' job-N.spool made by the same relative name are both still there; the tmp-N.part
    unlinked in one folder leaves the other's counted (before: the program's table kept one file
    per name, so the first folder's spools were never matched and the second's parts were
    forgotten by the first's unlink); old.spool, there before, is not counted as made."""
    (shm_dir / "a").mkdir()
    (shm_dir / "b").mkdir()
    (shm_dir / "a" / "old.spool").write_bytes(b"x" * 4096)
    p = subprocess.Popen(
        [sys.executable, "-c", MAKER, str(shm_dir / "a"), str(shm_dir / "b")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_for_line(p, "ready")
        r = memdiag("probe", "shmwriter", "--pid", str(p.pid), "--duration", "3", "--json")
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["status"] == "ok", data
    places = _places(data)
    a, b = f"{shm_dir}/a/job-*.spool", f"{shm_dir}/b/job-*.spool"
    parts = f"{shm_dir}/b/tmp-*.part"
    assert places.get(a, 0) > 5 and abs(places.get(a, 0) - places.get(b, 0)) <= 1, places
    assert abs(places.get(parts, 0) - places[b]) <= 1, places  # the second folder's parts stay
    assert f"{shm_dir}/a/tmp-*.part" not in places, places  # the first's were unlinked
    assert f"{shm_dir}/a/old.spool" not in places, places  # there before the trace: opened, not made


def test_a_target_in_its_own_ipc_namespace_is_said_unread(memdiag, tmp_path):
    """/proc/sysvipc/shm is memdiag's IPC namespace's: a target in its own (a container's) has its
    segments unread, and the report says so in one line (before: nothing said, none shown)."""
    p = subprocess.Popen(["unshare", "--ipc", "sleep", "120"])
    try:
        wait_until(lambda: os.readlink(f"/proc/{p.pid}/ns/ipc") != os.readlink("/proc/self/ns/ipc"), "unshare")
        r = memdiag("--pid", str(p.pid), "--duration", "4", "--output", str(tmp_path), timeout=240)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    found = next(f["summary"] for f in rep["findings"] if f["id"] == "sysv-segments-not-read")
    assert (
        found
        == "its IPC namespace is not memdiag's: System V segments not read (1 of its processes at the window's end)"
    )
    assert "System V segments not read" in (tmp_path / "report.md").read_text()


# A job process forked every 0.2 s lives 0.8 s (long enough for the probe to be aimed at it: a cgroup
# target's new processes are aimed twice a second), makes one spool file and exits.
JOBS = """
import os, sys, time
n = 0
while True:
    if os.fork() == 0:
        time.sleep(0.8)
        fd = os.open(os.path.join(sys.argv[1], f"job-{n}.spool"), os.O_CREAT | os.O_WRONLY, 0o600)
        os.write(fd, b"x" * 4096)
        os._exit(0)
    n += 1
    time.sleep(0.2)
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
"""


def test_files_made_by_jobs_that_exited_are_still_matched(memdiag, shm_dir, memcg):
    """The makers of a cgroup's spool are short-lived jobs, all gone when the trace ends: their files
    are looked up in the view each had while it ran (before: through their /proc, gone, so every
    file counted as gone and none still there)."""
    cg = memcg(None)
    p = subprocess.Popen([sys.executable, "-c", JOBS, str(shm_dir)], stdout=subprocess.DEVNULL)
    try:
        cg.procs_file.write_text(str(p.pid))
        r = memdiag("probe", "shmwriter", "--cgroup", cg.path, "--duration", "4", "--json")
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    places = _places(data)
    assert places.get(f"{shm_dir}/job-*.spool", 0) > 3, (places, data["unmatched"])
