"""Containers as targets, with a real runtime: podman (runc, cgroupfs) running an image built on
this machine from the workload kit's binaries (tests/containers.py), diagnosed by the real memdiag
CLI and by a real `memdiag serve`, with real BPF."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

from containers import Image, container, leftovers, ns_pid, podman, processes_in, shared_libraries
from kit import build
from memdiag.diagnose.culprit import split_frame
from memdiag.diagnose.serve.oomwatch import KnownContainers
from serve.conftest import Server

MiB = 1 << 20


def test_the_kit_runs_a_workload_in_its_own_memory_cgroup_with_its_limit(podman_container):
    c = podman_container("leak", "256", memory="96m", memory_swap="96m", init=True)
    assert c.cgroup == f"/libpod_parent/libpod-{c.id}" and len(c.id) == 64
    limit = Path("/sys/fs/cgroup/memory", c.cgroup.lstrip("/"), "memory.limit_in_bytes").read_text()
    assert int(limit) == 96 * MiB
    pids = processes_in(c.cgroup)
    assert c.pid in pids and len(pids) == 2  # catatonit (--init) and the workload
    leak = next(p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "leak")
    assert ns_pid(leak) > 1 and ns_pid(c.pid) == 1 and f"ready {ns_pid(leak)}" in c.logs()
    assert Path(f"/proc/{leak}/root/app/leak").read_bytes() == build("leak").read_bytes()
    assert c.inspect("{{.Name}}") == c.name and c.inspect("{{.HostConfig.Memory}}") == str(96 * MiB)


def test_the_kit_removes_its_image_and_containers(root_required):
    with Image({"leak": build("leak")}) as image:
        assert image.build_seconds < 30
        libs = shared_libraries(build("leak"))
        assert any("libc.so" in lib for lib in libs) and any("ld-linux" in lib for lib in libs)
        with container(image, "leak", "64") as c:
            assert c.start_seconds < 30
            assert c.name in leftovers()[0]
            try:
                with container(image, "leak", "64", name=f"{c.name}-x", ready="never printed", timeout=1):
                    pass
                raise AssertionError("a container that never gets ready must raise")
            except RuntimeError as e:
                assert "did not start" in str(e)
            assert f"{c.name}-x" not in leftovers()[0]  # removed by the failed start itself
        assert c.name not in leftovers()[0]
    names, tags = leftovers()
    assert c.name not in names and image.tag.split(":")[0] not in tags


def test_an_image_of_a_program_whose_path_runs_through_tmp_is_imported(root_required, tmp_path):
    """A checkout cloned under /tmp puts the kit's binaries below /tmp: the root-fs tarball names
    each folder once (tmp included, and sticky), or podman refuses it ("duplicates of file paths
    not supported"), and the program runs from its path inside the image."""
    assert str(tmp_path).startswith("/tmp/")
    program = tmp_path / "bin" / "leak"
    program.parent.mkdir()
    program.write_bytes(build("leak").read_bytes())
    program.chmod(0o755)
    with Image({str(program): program}) as image, container(image, str(program), "64") as c:
        assert Path(f"/proc/{c.pid}/root{program}").read_bytes() == program.read_bytes()
        assert Path(f"/proc/{c.pid}/root/tmp").stat().st_mode & 0o7777 == 0o1777


# --- a leak in a container, named by the container -------------------------------------------------


def _diagnose_container(memdiag, out: Path, ref: str, duration: str = "15") -> tuple[dict, str]:
    r = memdiag("--container", ref, "--duration", duration, "--output", str(out), timeout=240)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads((out / "report.json").read_text()), (out / "report.md").read_text()


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def test_a_leak_in_a_container_named_by_its_name(podman_container, memdiag, tmp_path):
    """With --init the leak is not the container's first process (podman-init, i.e. catatonit, is): the culprit
    still the leak, by its host pid, with its own pid in the container beside it."""
    c = podman_container("leak", "2048", memory="256m", memory_swap="256m", init=True)
    [leak] = [p for p in processes_in(c.cgroup) if _comm(p) == "leak"]
    inside = ns_pid(leak)
    assert inside != leak and inside > 1
    rep, md = _diagnose_container(memdiag, tmp_path, c.name)
    v = rep["verdict"]
    assert v["kind"] == "leak" and "leak_order_history" in v["summary"], v  # memleak ran on the container's process
    assert v["culprit"]["function"] == "leak_order_history" and v["culprit"]["pid"] == leak
    assert any(split_frame(f) == ("leak_order_history", "leak") for f in v["culprit"]["stack"]), v["culprit"]
    t = rep["target"]
    assert t["kind"] == "pid" and t["pid"] == leak and t["cgroup"] == c.cgroup  # its largest process, as serve does
    assert t["container"]["id"] == c.id and t["container"]["name"] == c.name
    assert t["container"]["image"] == c.image.tag and t["container"]["limit_bytes"] == 256 * MiB
    assert md.startswith(f"# memdiag: leak — PID {leak} (leak) in container {c.name} ({c.short_id})")
    assert f"- Container: **{c.name}**, id `{c.short_id}` (full `{c.id}`), podman, image `{c.image.tag}`" in md
    assert f"- Container memory: limit 256 MiB, OOM kills 0 (the cgroup's counter), cgroup `{c.cgroup}`" in md
    assert f"PID {leak} (leak), PID {inside} in the container" in md
    assert f"- Main process: PID {c.pid} on the host" in md and _comm(c.pid) == "podman-init"


def test_a_leak_in_a_container_named_by_a_short_id(podman_container, memdiag, tmp_path):
    c = podman_container("leak", "2048", memory="128m", memory_swap="128m")
    rep, md = _diagnose_container(memdiag, tmp_path, c.short_id)
    v = rep["verdict"]
    assert "leak_order_history" in v["summary"] and v["culprit"]["pid"] == c.pid, v
    assert rep["target"]["container"]["id"] == c.id and rep["target"]["container"]["host_pid"] == c.pid
    assert f"- Container: **{c.name}**, id `{c.short_id}`" in md and "limit 128 MiB" in md
    assert f"PID {c.pid} (leak), PID 1 in the container" in md  # the workload is the container's init


def test_a_containerized_pid_is_symbolized_from_the_containers_file_not_the_hosts_same_path(
    podman_container, memdiag, tmp_path, root_required
):
    """The container's binary sits at a path that on the host holds another program (the kit's
    hog): frames come from the file the process maps (leak's functions), never from the host's
    file of the same path (hog's). Named by its host pid, the target still carries its container."""
    decoy = build("hog")
    with Image({str(decoy): build("leak")}) as image:
        c = podman_container(str(decoy), "2048", image=image, memory="256m", memory_swap="256m")
        assert _comm(c.pid) == "hog" and Path(f"/proc/{c.pid}/root{decoy}").read_bytes() == build("leak").read_bytes()
        r = memdiag("--pid", str(c.pid), "--duration", "15", "--output", str(tmp_path / "out"), timeout=240)
        assert r.returncode == 0, r.stderr
        rep = json.loads((tmp_path / "out" / "report.json").read_text())
    v = rep["verdict"]
    assert v["culprit"]["function"] == "leak_order_history" and v["culprit"]["pid"] == c.pid, v
    frames = [f for s in rep["stacks"] for f in s["frames"]]
    assert any(split_frame(f) == ("leak_order_history", "hog") for f in frames), frames
    assert not any("working_set" in f for f in frames), frames  # hog's own functions: the host's file
    assert rep["target"]["container"]["id"] == c.id and rep["target"]["container"]["name"] == c.name
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.startswith(f"# memdiag: {v['kind']} — PID {c.pid} (hog) in container {c.name} ({c.short_id})")


# --- bad container references: one line on stderr, exit 2, nothing started ----------------------


def _usage_error(memdiag, tmp_path: Path, *args: str) -> str:
    """memdiag ARGS must stop at a usage error: one stderr line, exit 2, nothing on stdout, no report."""
    out = tmp_path / f"report-{secrets.token_hex(4)}"
    r = memdiag(*args, "--duration", "5", "--output", str(out))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert not out.exists()
    return lines[0]


def test_an_unknown_container_name_is_one_line_listing_what_runs(podman_container, memdiag, tmp_path):
    c = podman_container("leak", "64")
    line = _usage_error(memdiag, tmp_path, "--container", "no-such-container-7f3a")
    assert "no-such-container-7f3a" in line and "no such running container" in line
    assert f"{c.short_id} ({c.name})" in line  # what does run, so the user can pick


def test_an_unknown_id_and_a_short_prefix_are_one_line_each(podman_container, memdiag, tmp_path):
    c = podman_container("leak", "64")
    other = "f" * 64 if not c.id.startswith("f") else "e" * 64
    line = _usage_error(memdiag, tmp_path, "--container", other)
    assert other in line and "no such running container" in line
    line = _usage_error(memdiag, tmp_path, "--container", f"containerd://{other[:12]}")
    assert other[:12] in line and "no such running container" in line
    line = _usage_error(memdiag, tmp_path, "--container", c.id[:3])
    assert c.id[:3] in line and "at least 4 hex digits" in line


def test_an_empty_or_malformed_reference_is_one_line(podman_container, memdiag, tmp_path):
    podman_container("leak", "64")
    for ref in ("", " ", "../etc", "a b", "-x"):
        line = _usage_error(memdiag, tmp_path, f"--container={ref}")
        assert "--container" in line, (ref, line)


def test_a_stopped_container_is_said_to_be_not_running(podman_container, memdiag, tmp_path):
    c = podman_container("leak", "64")
    podman("stop", "--time", "0", c.id)
    line = _usage_error(memdiag, tmp_path, "--container", c.name)
    assert c.name in line and "not running" in line


def test_an_ambiguous_prefix_lists_the_containers_it_matches(podman_container, memcg, memdiag, tmp_path):
    """A podman container and, on the same host, a Docker (cgroupfs driver) container folder whose id
    shares its first 8 hex digits: the cgroup tree alone lists both, so the prefix is ambiguous."""
    c = podman_container("leak", "64")
    twin = c.id[:8] + ("0" if c.id[8] != "0" else "1") + secrets.token_hex(28)[:55]
    parent = memcg(None)
    (parent.fs_path / "docker").mkdir()
    (parent.fs_path / "docker" / twin).mkdir()
    try:
        line = _usage_error(memdiag, tmp_path, "--container", c.id[:8])
        assert "ambiguous" in line and "2 containers" in line, line
        assert f"{c.short_id} ({c.name})" in line and twin[:12] in line
    finally:
        (parent.fs_path / "docker" / twin).rmdir()
        (parent.fs_path / "docker").rmdir()


# --- an alert with container labels, to a real `memdiag serve` ----------------------------------


def _alertmanager_body(labels: dict) -> dict:
    """A whole Alertmanager v4 webhook notification carrying one firing alert with these labels."""
    return {
        "version": "4",
        "status": "firing",
        "receiver": "memdiag",
        "groupKey": '{}:{alertname="ContainerMemoryGrowth"}',
        "truncatedAlerts": 0,
        "groupLabels": {"alertname": "ContainerMemoryGrowth"},
        "commonLabels": labels,
        "commonAnnotations": {},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": {"summary": "container memory climbing"},
                "startsAt": "2026-12-01T02:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "",
                "fingerprint": secrets.token_hex(8),
            }
        ],
    }


def _asked(srv) -> list[dict]:
    """The incidents alerts and requests made (the OOM watch records other tests' kills on this host too)."""
    return [i for i in srv.incidents() if i["source"] != "oomwatch"]


def test_an_alert_with_container_labels_becomes_that_containers_diagnosis(podman_container, tmp_path):
    c = podman_container("leak", "2048", memory="256m", memory_swap="256m")
    bystander = podman_container("churn", "1000")  # another container on the host, not the alert's
    srv = Server(tmp_path / "data", duration=15).start()
    try:
        labels = {
            "alertname": "ContainerMemoryGrowth",
            "container_id": f"containerd://{c.id}",
            "image": c.image.tag,
            "name": c.name,
        }
        status, body = srv.post("/alerts/alertmanager", _alertmanager_body(labels))
        assert status == 202, body
        [incident] = _asked(srv)
        assert incident["source"] == "alertmanager"
        t = incident["target"]
        assert t["pid"] == c.pid and t["container"]["id"] == c.id and t["container"]["name"] == c.name
        assert c.name in t["description"] and bystander.name not in t["description"]
        done = srv.wait(incident["id"], timeout=180)
        rep = json.loads(srv.get(f"/incidents/{incident['id']}?format=json")[1])
        assert done["state"] == "done" and "leak_order_history" in done["summary"], (done["summary"], rep["trail"])
        assert rep["verdict"]["culprit"]["pid"] == c.pid and rep["target"]["container"]["name"] == c.name
        md = srv.get(f"/incidents/{incident['id']}?format=md")[1].decode()
        assert md.startswith(f"# memdiag: {done['verdict_kind']} — PID {c.pid} (leak) in container {c.name}")
        assert f"- Container: **{c.name}**, id `{c.short_id}`" in md and "limit 256 MiB" in md
        # POST /diagnose by name names the same container; an unknown one is refused in one line
        status, body = srv.post("/diagnose", {"container": bystander.name})
        assert status == 202, body
        assert {i["target"]["container"]["name"] for i in _asked(srv)} == {c.name, bystander.name}
        status, body = srv.post("/diagnose", {"container": "no-such-container-7f3a"})
        assert status == 404 and "no-such-container-7f3a" in body["error"], body
        status, body = srv.post("/alerts/alertmanager", _alertmanager_body({"container_id": "docker://" + "0" * 64}))
        assert status == 404, body
        assert len(_asked(srv)) == 2
    finally:
        srv.stop()


def test_the_oom_watch_names_a_container_started_just_after_a_runtime_listing(podman_container):
    """serve's OOM watch learns each new container's name while it runs (a container removed at its
    kill is named from that); one started within the listing's cache (2 s) of an earlier listing is
    not in that listing, and must still be named within a few polls, not left nameless."""
    first = podman_container("leak", "64")
    known = KnownContainers()
    known.refresh()  # asks podman for the list (cached), names `first`
    assert known.known[first.id].name == first.name
    t0 = time.monotonic()
    second = podman_container("leak", "64")
    known.refresh()
    assert time.monotonic() - t0 < 2.0  # the case: the cached listing predates `second`
    while known.known[second.id].name is None and time.monotonic() - t0 < 5.0:
        time.sleep(0.25)  # the watch's poll
        known.refresh()
    assert known.known[second.id].name == second.name, known.known[second.id]
