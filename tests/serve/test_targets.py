"""Alert labels to targets on real cgroups named the way container runtimes and the kubelet name
them (systemd and cgroupfs styles), found by walking the memory hierarchy; POST /diagnose's cgroup
on a real server, resolved as the CLI's --cgroup is."""

import json
import uuid
from pathlib import Path

import pytest
from memdiag.diagnose.serve.targets import BadLabel, NotOnHost, target_from_labels

MiB = 1 << 20


def test_container_id_finds_the_scope_and_its_largest_process(workload, memcg):
    cid = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, like a container id
    parent = memcg(None)  # stands for system.slice: the runtime's own folder name is the last step
    cg = memcg(None, name=f"{parent.name}/docker-{cid}.scope")
    small = workload("churn", "1000", cgroup=cg)
    big = workload("cache", "32", "1", cgroup=cg)
    _until_rss(big.pid, 32 << 20)  # the cache has filled: it is the largest by RSS
    for label in (f"docker://{cid}", f"containerd://{cid}", cid):
        t = target_from_labels({"container_id": label})
        assert t.kind == "pid" and t.pid == big.pid, label
        assert t.container.id == cid and t.container.runtime == "docker" and t.container.cgroup == cg.path, label
    assert small.pid != big.pid


def test_pod_uid_in_systemd_and_cgroupfs_naming(workload, memcg):
    uid = str(uuid.uuid4())
    cg = memcg(None, name=f"memdiag-test-kubepods-burstable-pod{uid.replace('-', '_')}.slice")
    w = workload("churn", "1000", cgroup=cg)
    assert target_from_labels({"uid": uid}).pid == w.pid


def test_cadvisor_id_and_an_empty_cgroup(memcg):
    cg = memcg(None)
    t = target_from_labels({"id": cg.path})
    assert t.kind == "cgroup" and t.cgroup.path == cg.path  # nothing runs in it: the cgroup itself


@pytest.mark.parametrize(
    "labels",
    [
        {"id": "/a/../../etc"},
        {"id": "relative"},
        {"container_id": "docker://x;y"},
        {"uid": "not-a-uid"},
        {"pid": "0"},
        {"pid": "12a"},
        {"alertname": "x"},
    ],
)
def test_bad_labels(labels):
    with pytest.raises(BadLabel):
        target_from_labels(labels)


def test_valid_labels_naming_nothing_here(root_required):
    with pytest.raises(NotOnHost):
        target_from_labels({"container_id": "docker://" + "0" * 64})
    with pytest.raises(NotOnHost):
        target_from_labels({"id": "/no/such/cgroup"})
    with pytest.raises(NotOnHost):
        target_from_labels({"pid": "4000000"})


def test_a_cgroup_that_only_contains_the_id_is_not_the_container(memcg):
    """A folder named x<id> (anyone allowed to make a cgroup could) does not take the container's
    alerts; two unrelated folders naming the same container are ambiguous, listed, not guessed."""
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    parent = memcg(None, name=f"memdiag-test-kube-{cid[:8]}")
    real = memcg(None, name=f"{parent.name}/docker-{cid}.scope")
    memcg(None, name=f"memdiag-test-x{cid}")
    memcg(None, name=f"memdiag-test-{cid}-backup")
    for label in (f"docker://{cid}", cid[:12]):
        t = target_from_labels({"container_id": label})
        assert t.kind == "cgroup" and t.cgroup.path == real.path, label
    other = memcg(None)
    twin = memcg(None, name=f"{other.name}/crio-{cid}.scope")
    with pytest.raises(BadLabel) as e:
        target_from_labels({"container_id": cid})
    assert str(e.value) == f"label container_id {cid}: ambiguous, matches 2 containers: " + ", ".join(
        sorted([real.path, twin.path])
    )


def test_pod_uid_in_cgroupfs_naming_with_its_container(workload, memcg):
    """/kubepods/burstable/pod<uid>/<id>: the uid label names the pod; the process diagnosed is
    the pod's largest, which runs in a container folder below it, and the target says which."""
    uid, cid = str(uuid.uuid4()), uuid.uuid4().hex + uuid.uuid4().hex
    top = memcg(None)
    kube = memcg(None, name=f"{top.name}/kubepods")
    qos = memcg(None, name=f"{kube.name}/burstable")
    pod = memcg(None, name=f"{qos.name}/pod{uid}")
    ctr = memcg(None, name=f"{pod.name}/{cid}")
    w = workload("churn", "1000", cgroup=ctr)
    t = target_from_labels({"uid": uid})
    assert t.kind == "pid" and t.pid == w.pid
    assert t.pod.uid == uid and t.pod.qos == "burstable" and t.pod.cgroup == pod.path
    assert [c.id for c in t.pod.containers] == [cid]
    assert t.container.id == cid and t.container.pod_uid == uid and t.container.host_pid == w.pid
    t = target_from_labels({"id": pod.path})  # cAdvisor's pod-level series
    assert t.pid == w.pid and t.pod.uid == uid and t.pod.cgroup == pod.path and t.container.id == cid


def test_pod_names_need_crictl_and_cadvisor_id_stands_in(memcg):
    """Without crictl a pod name cannot be resolved: one clear line; with cAdvisor's id beside it,
    the id (the cgroup itself) is used."""
    from memdiag.diagnose.containers import installed_clis

    if "crictl" in installed_clis():
        pytest.skip("crictl is installed: pod names resolve through it")
    with pytest.raises(BadLabel) as e:
        target_from_labels({"namespace": "shop", "pod": "orderd-5d8f", "container": "orderd"})
    assert str(e.value) == "pod orderd-5d8f: pod names need crictl, which is not installed here: give the pod's uid"
    cg = memcg(None)
    t = target_from_labels({"namespace": "shop", "pod": "orderd-5d8f", "id": cg.path})
    assert t.kind == "cgroup" and t.cgroup.path == cg.path


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"pod": "Not_A_Pod"}, "label pod: not a pod name"),
        ({"uid": "12345678-1234-1234-1234-12345678"}, "label uid: not a pod uid"),
        ({"name": "-x"}, "label name: not a container name"),
        (
            {"container_id": "docker://abc"},
            "label container_id: expected containerd://, cri-o:// or docker:// and a hex id",
        ),
    ],
)
def test_bad_container_and_pod_labels(labels, message):
    with pytest.raises(BadLabel) as e:
        target_from_labels(labels)
    assert str(e.value) == message


def test_a_name_label_that_names_no_container(root_required):
    with pytest.raises(NotOnHost) as e:
        target_from_labels({"name": "memdiag-no-such-container"})
    assert str(e.value).startswith("label name memdiag-no-such-container: no such running container")
    assert "running:" not in str(e.value)  # a webhook's sender is not told what runs here


def test_diagnose_takes_the_cgroup_paths_the_cli_takes_and_the_root_is_the_whole_system(server, memcg, workload):
    srv = server(duration=1, extra=["--no-oom-watch"])
    cg = memcg(None)
    w = workload("churn", "1000", cgroup=cg)
    # the hierarchy path, without its '/', and the folder under the mount (refused before: "label id: ...")
    for value in (cg.path, cg.path.lstrip("/"), str(cg.fs_path)):
        status, body = srv.post("/diagnose", {"cgroup": value})
        assert status == 202, (value, body)
        done = srv.wait(body["id"], timeout=60)
        assert done["state"] == "done" and done["target"]["pid"] == w.pid and done["target"]["cgroup"] == cg.path
    for value in (cg.path + "-gone", f"{cg.fs_path}-gone"):
        status, body = srv.post("/diagnose", {"cgroup": value})
        assert status == 404 and body["error"].startswith(f"cgroup: '{value}' is not a memory cgroup"), body
    status, body = srv.post("/diagnose", {"cgroup": "a/../b"})
    assert status == 422 and body["error"].startswith("cgroup: not a cgroup path"), body
    firing = [{"status": "firing", "labels": {"id": cg.path + "-gone"}}]  # a label says it is one
    status, body = srv.post("/alerts/alertmanager", {"alerts": firing})
    assert (status, body) == (404, {"error": "label id: no such cgroup on this host"})
    # the root: the whole system, no process traced (before: the host's largest process, here PID 1)
    for value in ("/", str(cg.mount)):
        status, body = srv.post("/diagnose", {"cgroup": value})
        assert status == 202, (value, body)
        done = srv.wait(body["id"], timeout=60)
        assert done["state"] == "done", done
        assert done["target"] == {
            "kind": "system", "pid": None, "comm": None, "cgroup": None, "description": "the whole system",
            "container": None, "pod": None,
        }  # fmt: skip
        report = json.loads(srv.get(f"/incidents/{body['id']}?format=json")[1])
        assert report["target"]["kind"] == "system" and report["target"]["pid"] is None
        traced = [p for p in report["probes"] if p["name"] in ("memleak", "reach") and p["status"] in ("ok", "partial")]
        assert traced == []  # a system target: memleak and the reachability scan attach to no process


def _until_rss(pid: int, size: int, timeout: float = 30) -> None:
    """Wait for a process's resident size (VmRSS) to reach size bytes."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        status = Path(f"/proc/{pid}/status").read_text()
        rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1]) << 10
        if rss >= size:
            return
        assert time.monotonic() < deadline, f"PID {pid} holds {rss} bytes after {timeout} s, not {size}"
        time.sleep(0.1)
