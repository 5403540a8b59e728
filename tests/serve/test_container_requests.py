"""POST /diagnose {"container": ...} and container labels against a running `memdiag serve`, on a
real memory cgroup named as Docker's systemd driver names a container, with a real workload in it
(real podman containers are tests/e2e/test_containers*.py's)."""

import uuid

MiB = 1 << 20


def test_post_diagnose_container_by_id_prefix(server, memcg, workload):
    parent = memcg(None)  # stands for system.slice
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    cg = memcg(128 * MiB, name=f"{parent.name}/docker-{cid}.scope")
    w = workload("churn", "1000", cgroup=cg)
    srv = server(duration=3)
    status, body = srv.post("/diagnose", {"container": cid[:12]})
    assert status == 202, body
    done = srv.wait(body["id"])
    target = done["target"]
    assert (target["kind"], target["pid"]) == ("pid", w.pid)  # the container's largest process
    assert target["container"]["id"] == cid and target["container"]["limit_bytes"] == 128 * MiB
    assert target["description"] == f"PID {w.pid} (churn) in container {cid[:12]}"
    md = srv.get(f"/incidents/{body['id']}?format=md")[1].decode().splitlines()
    assert md[0].endswith(f"— PID {w.pid} (churn) in container {cid[:12]}")
    assert f"- Container: id `{cid[:12]}` (full `{cid}`), docker" in md


def test_post_diagnose_container_refusals(server, memcg):
    parent = memcg(None)
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    twin = cid[:16] + (uuid.uuid4().hex * 2)[16:]  # shares 16 digits with cid
    memcg(None, name=f"{parent.name}/docker-{cid}.scope")
    memcg(None, name=f"{parent.name}/crio-{twin}.scope")
    srv = server(duration=3)
    both = f"{twin}, {cid}"  # in path order (crio- before docker-); full ids, their short ones alike
    cases = [
        ({"container": "a b"}, 422, "container: not a container id or name (letters, digits, '_', '.', '-')"),
        ({"container": cid[:8]}, 422, f"container {cid[:8]}: an id prefix needs at least 12 hex digits"),
        ({"container": cid[:16]}, 422, f"container {cid[:16]}: ambiguous, matches 2 containers: {both}"),
        ({"container": "memdiag-no-such"}, 404, "container memdiag-no-such: no such running container"),
        ({"container": cid, "pid": 1}, 422, "name exactly one of pid, cgroup, container_id, container"),
    ]
    for payload, code, error in cases:
        status, body = srv.post("/diagnose", payload)
        assert status == code and body["error"].startswith(error), (payload, body)
        assert len(body["error"].splitlines()) == 1
    assert [i for i in srv.incidents() if i["source"] != "oomwatch"] == []
