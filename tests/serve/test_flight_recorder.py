"""The flight recorder of a real `memdiag serve` at its defaults, with no alert sent: an OOM kill
explained by what grew before it (the cgroup ledger's part, the trend, the victim's share, the
function its fault sample named, the JVM's own heap counters, the tmpfs files), the restarted
service verified against it, and the look-back read over HTTP. Other tests on this machine may
OOM-kill at the same time: incidents are picked by pid."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from kit import build, wait_until

MiB = 1 << 20


def _scene(incident: dict) -> dict:
    scene = incident["alert"].get("scene")
    assert scene is not None, incident["summary"]
    return scene


def _part(scene: dict, key: str) -> dict:
    return next(p for p in scene["parts"] if p["key"] == key)


def _accounts(scene: dict) -> None:
    """The parts and the residual sum to the usage's growth: the explanation accounts for it."""
    assert sum(p["growth"] for p in scene["parts"]) == scene["growth"], scene["parts"]


def test_a_native_leak_killed_at_its_limit_is_explained_by_its_climb_and_function(server, workload, memcg):
    srv = server()
    srv.oom_watch_attached(120)
    cg = memcg(64 * MiB, swap=False)
    started = time.time()
    # 1.5 MiB/s, a page per record, from leak_order_history(): past 64 MiB in about 40 s
    w = workload("leak", "1536", "1024", cgroup=cg)
    assert w.wait_exit(120) is not None, "the leak was not killed"
    incident = srv.kill_incident(w.pid)
    scene = _scene(incident)
    assert scene["shape"] == "steady", scene["text"]
    assert scene["top_part"] == "anon" and _part(scene, "anon")["share"] > 80, scene["parts"]
    _accounts(scene)
    assert started - 2 * scene["every_s"] <= scene["climb_from"] <= started + 15
    assert 0.5 * MiB < scene["rate_per_s"] < 3 * MiB  # 1.5 MiB/s leaked, pages and allocator headers
    assert scene["victim_rss_last"] > 32 * MiB and scene["victim_share"] > 80
    assert scene["fault_function"] == "leak_order_history", scene
    said = incident["summary"]
    assert f"killed PID {w.pid} (leak)" in said and "before the kill the recorder" in said
    assert "climb steadily" in said and "anonymous +" in said
    assert "page-fault sample" in said and "named leak_order_history" in said

    # the look-back over HTTP: the cgroup's series and the victim's, with its fault sample
    def victim_ended() -> dict | None:  # at the recorder's first round after the kill
        status, raw = srv.get(f"/cgroups?path={cg.path}")
        assert status == 200, raw
        back = json.loads(raw)
        (victim,) = [p for p in back["processes"] if p["pid"] == w.pid]
        return back if victim["ended"] is not None else None

    back = wait_until(victim_ended, "the recorder to see the victim gone", timeout=3 * scene["every_s"])
    assert back["fields"][:2] == ["usage", "limit"] and len(back["points"]) >= 4
    assert all(p[2] == 64 * MiB for p in back["points"])  # the limit, every sample
    (victim,) = [p for p in back["processes"] if p["pid"] == w.pid]
    assert victim["comm"] == "leak" and victim["points"][-1][1] > 32 * MiB
    print(said)
    assert victim["faults"]["function"] == "leak_order_history"
    listed = json.loads(srv.get("/cgroups")[1])
    assert cg.path in [c["path"] for c in listed["cgroups"]] and listed["series_bytes"] > 0


def test_a_service_restarted_after_its_kill_is_verified_against_the_recorders_scene(server, workload, memcg):
    srv = server()
    srv.oom_watch_attached(120)
    cg = memcg(48 * MiB, swap=False)
    # a supervisor in the cgroup restarts the leak when it dies (as systemd's Restart=always would)
    sup = workload("supervise", str(build("leak")), "1536", "1024", cgroup=cg)
    first = wait_until(lambda: _child(sup.pid, "leak"), "the leak to start", timeout=30)
    wait_until(lambda: _child(sup.pid, "leak") not in (None, first), "the leak to be killed and restarted", timeout=120)
    incident = srv.kill_incident(first)
    done = srv.wait(incident["id"], timeout=180)
    assert done["state"] == "done", done
    assert done["verification"] == "still-leaking", done
    report = json.loads(srv.get(f"/incidents/{incident['id']}?format=json")[1])
    v = report["verification"]
    assert v["baseline_verdict"] == "oom" and v["baseline_function"] == "leak_order_history"
    assert "grows again" in v["summary"] and "before the kill" in v["summary"]
    page = srv.get(f"/incidents/{incident['id']}?format=html")[1].decode()  # the recorder's samples charted in it
    assert '<h2 id="before-the-kill">' in page and '<div id="scene-chart"></div>' in page
    data = json.loads(re.search(r'id="memdiag-data">(.*?)</script>', page, re.S).group(1))
    assert [s["label"] for s in data["scene"]["series"]][:2] == ["cgroup usage", "cgroup limit"]
    assert max(data["scene"]["x"]) <= 0 and 48 * MiB in data["scene"]["series"][1]["values"]


def _child(parent: int, comm: str) -> int | None:
    """The pid of the parent's child named comm, or None."""
    try:
        kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    for pid in kids:
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == comm:
                return int(pid)
        except OSError:
            continue
    return None


def test_a_cgroup_filled_by_tmpfs_files_names_shared_memory_and_the_files(server, workload, memcg, shm_dir):
    srv = server()
    srv.oom_watch_attached(120)
    cg = memcg(64 * MiB, swap=False)
    # 20 jobs of 64 KiB a second, every one left behind: about 1.3 MiB/s of files in /dev/shm
    w = workload("spooler", str(shm_dir), "20", "65536", "1", cgroup=cg)
    assert w.wait_exit(120) is not None, "the spooler was not killed"
    incident = srv.kill_incident(w.pid)
    scene = _scene(incident)
    assert scene["top_part"] == "shmem" and _part(scene, "shmem")["share"] > 80, scene["parts"]
    _accounts(scene)
    assert scene["victim_share"] is not None and scene["victim_share"] < 20  # no process's RSS holds it
    pattern, files, held = scene["shm_files"][0]
    assert pattern == f"/dev/shm/{shm_dir.name}/job-*.spool" and files > 100 and held > 16 * MiB
    said = incident["summary"]
    assert "shared memory (tmpfs, shm) +" in said and f"{shm_dir.name}/job-*.spool" in said


def test_a_java_service_in_a_container_killed_at_its_limit_names_the_java_heap(server, jvm_container):
    srv = server()
    srv.oom_watch_attached(120)
    # the seed's service: an error branch parks 16 KiB buffers, ~6 MiB/s at 3,000 batches/s; its heap
    # may grow to 1 GiB, its container holds 192 MiB: the kernel kills it before the JVM would throw.
    # podman's restart policy starts it again once (the seed's "third time this week")
    c = jvm_container(
        "OrderService", "3000", "8", jvm=("-Xmx1g", "-XX:+UseSerialGC"), memory="192m", restart="on-failure:1"
    )
    incident = srv.kill_incident(c.pid, timeout=150)
    scene = _scene(incident)
    assert incident["target"]["container"]["name"] == c.name
    assert scene["shape"] == "steady" and scene["top_part"] == "anon", scene["text"]
    _accounts(scene)
    assert scene["jvm_heap_max"] == 1 << 30
    assert scene["jvm_heap_last"] > scene["jvm_heap_first"] + 32 * MiB  # what survives GC climbed
    said = incident["summary"]
    assert f"in container {c.name}" in said and "the Java heap after GC (its own counters)" in said
    assert "of its 1.0 GiB maximum (-Xmx)" in said
    # the container restarted by podman: the new JVM diagnosed and verified against the scene
    done = srv.wait(incident["id"], timeout=150)
    assert done["state"] == "done" and done["verification"] == "still-leaking", done
    report = json.loads(srv.get(f"/incidents/{incident['id']}?format=json")[1])
    assert report["target"]["pid"] != c.pid and report["target"]["container"]["name"] == c.name
    assert report["verification"]["baseline_verdict"] == "oom", report["verification"]
    assert "grows again" in report["verification"]["summary"]  # and, at 6 MiB/s, likely killed again
