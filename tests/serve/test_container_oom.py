"""OOM kills inside real podman containers, recorded by a real `memdiag serve`'s OOM watch under
the container's name and id, with its limit and the victim's host and in-container pids; also a
container removed at once after its kill (`podman run --rm`), named from what was seen while it
ran. Other tests on this machine may OOM-kill at the same time: incidents are picked by pid."""

from __future__ import annotations

import json
import time

from containers import podman
from memdiag.diagnose.containers import ContainerInfo
from memdiag.diagnose.serve.oomwatch import KnownContainers, describe, incident_key, incident_place
from memdiag.probes.oomkill import OomEvent

MiB = 1 << 20


def gone(c, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while c.running() and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_container_oom_kill_is_an_incident_under_the_containers_name(server, podman_container):
    srv = server()
    srv.oom_watch_attached(120)
    # 4 MiB every 100 ms: past the 32 MiB limit within a second or so
    c = podman_container("hog", "256", "4", "100", memory="32m")
    gone(c)
    incident = srv.kill_incident(c.pid)
    alert, target = incident["alert"], incident["target"]
    assert alert["victim_comm"] == "hog" and alert["cgroup_oom"] is True
    assert alert["victim_own_pid"] == 1  # the container's own first process
    assert alert["limit"] == 32 * MiB and alert["memcg"] == c.cgroup
    assert target["kind"] == "container" and target["cgroup"] == c.cgroup
    assert (target["container"]["id"], target["container"]["name"]) == (c.id, c.name)
    assert target["container"]["runtime"] == "podman"
    said = incident["summary"]
    assert f"killed PID {c.pid} (hog, PID 1 in its pid namespace) in container {c.name} ({c.short_id})" in said
    assert "cgroup limit" in said and "(limit 32.0 MiB)" in said
    assert incident["state"] == "recorded"  # its only process was the victim: nothing to diagnose
    # measured: the runtime still knows the exited container (not removed), and says why it ended
    assert c.inspect("{{.State.Status}} {{.State.ExitCode}}") == "exited 137"


def test_a_container_removed_at_once_is_named_from_what_was_seen_while_it_ran(server, podman_container):
    srv = server()
    srv.oom_watch_attached(120)
    # --rm: podman removes the container as soon as its process is killed; 1 MiB every 200 ms
    # keeps it alive for about six seconds, long enough for the watch to see it run
    c = podman_container("hog", "256", "1", "200", memory="32m", extra=["--rm"])
    gone(c)
    incident = srv.kill_incident(c.pid)
    assert podman("container", "exists", c.id, check=False).returncode == 1  # removed: only memdiag knows
    container = incident["target"]["container"]
    assert (container["id"], container["name"]) == (c.id, c.name)
    assert container["limit_bytes"] == 32 * MiB  # read from its cgroup while it ran
    assert f"in container {c.name} ({c.short_id})" in incident["summary"]


def test_a_kill_in_a_kubernetes_pod_names_the_pod_and_is_keyed_by_its_container():
    """A kill as the kernel reports it under containerd's systemd layout (no pod runs here):
    the incident's place, key and summary speak of the container and its pod."""
    cid = "4c1d" * 16
    uid = "8dbd2d3c-2b5a-4e47-a1a5-3d6b1ef1b9a0"
    cgroup = (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod8dbd2d3c_2b5a_4e47_a1a5_3d6b1ef1b9a0.slice"
        f"/cri-containerd-{cid}.scope"
    )
    e = OomEvent(
        when=1700000000.25,
        victim_pid=4242,
        victim_host_pid=4242,
        victim_own_pid=7,
        victim_comm="api",
        trigger_pid=4242,
        trigger_comm="api",
        cgroup_oom=True,
        memcg=cgroup,
        victim_cgroup=cgroup,
        limit=256 * MiB,
    )
    # the cgroup path alone (the container is gone; no crictl here): its id and pod uid
    known = KnownContainers()
    bare = known.of(e)
    assert (bare.id, bare.runtime, bare.pod_uid, bare.name, bare.limit_bytes) == (cid, "containerd", uid, None, None)
    # what the runtime said while it ran completes what is left at the kill
    c = ContainerInfo(
        id=cid, name="api", runtime="containerd", cgroup=cgroup, pod_uid=uid, pod="web-7f", namespace="shop"
    )
    known.known[cid] = c
    assert known.of(e) == c
    place = incident_place(e, c)
    assert place["kind"] == "container" and place["container"]["pod"] == "web-7f"
    assert json.loads(json.dumps(place))["container"]["namespace"] == "shop"
    assert incident_key(e, c) == f"oom:containerd:{cid}:4242:1700000000.250000"
    said = describe(e, c)
    assert f"killed PID 4242 (api, PID 7 in its pid namespace) in container api ({cid[:12]}) of pod shop/web-7f" in said
    # a pod-level limit whose victim's container is not known: the pod is the place
    pod_cgroup = cgroup.rsplit("/", 1)[0]
    at_pod = e.model_copy(update={"memcg": pod_cgroup, "victim_cgroup": None})
    assert incident_place(at_pod, None) == {"kind": "pod", "cgroup": pod_cgroup, "pod_uid": uid, "qos": "burstable"}
    assert incident_key(at_pod, None) == f"oom:pod:{uid}:4242:1700000000.250000"
    assert f"(api, PID 7 in its pid namespace) in pod {uid}, anon RSS" in describe(at_pod, None)
    # a kill outside any container or pod keeps today's words and its cgroup as the place
    plain = e.model_copy(update={"memcg": "/app", "victim_cgroup": "/app"})
    assert incident_place(plain, None) == {"kind": "cgroup", "cgroup": "/app"}
    assert incident_key(plain, None) == "oom:cgroup:/app:4242:1700000000.250000"
    assert " in container " not in describe(plain, None) and " in pod " not in describe(plain, None)
