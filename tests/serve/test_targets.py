"""Alert labels to targets on real cgroups named the way container runtimes and the kubelet name
them (systemd and cgroupfs styles), found by walking the memory hierarchy."""

import uuid

import pytest
from memdiag.diagnose.serve.targets import BadLabel, NotOnHost, target_from_labels

MiB = 1 << 20


def test_container_id_finds_the_scope_and_its_largest_process(workload, memcg):
    cid = uuid.uuid4().hex + uuid.uuid4().hex  # 64 hex digits, like a container id
    cg = memcg(None, name=f"memdiag-test-docker-{cid}.scope")
    small = workload("churn", "1000", cgroup=cg)
    big = workload("cache", "32", "1", cgroup=cg)
    import time

    time.sleep(2)  # the cache has filled: it is the largest by RSS
    for label in (f"docker://{cid}", f"containerd://{cid}", cid):
        t = target_from_labels({"container_id": label})
        assert t.kind == "pid" and t.pid == big.pid, label
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
    twin = memcg(None, name=f"memdiag-test-crio-{cid}.scope")
    with pytest.raises(BadLabel) as e:
        target_from_labels({"container_id": cid})
    assert str(e.value).startswith("container matches 2 cgroups: ")
    assert real.path in str(e.value) and twin.path in str(e.value)
