"""Containers and pods from cgroup paths and trees, in the layouts this machine cannot run (cgroup
v2, the systemd driver, Docker, Kubernetes with containerd and CRI-O) as the runtimes and the
kubelet document them, and podman's cgroupfs v1 layout that it does run. Trees are real folders
with the files the readers open (memory.max or memory.limit_in_bytes, cgroup.procs) and a /proc
of status files; the runtime CLIs are not asked (clis=()), so what is resolved is what the tree says."""

from pathlib import Path

import pytest
from memdiag.diagnose.containers import container_of_cgroup, resolve_container, resolve_pod
from memdiag.diagnose.errors import AmbiguousTarget, UnknownTarget, UsageError
from memdiag.system.container import (
    list_containers,
    list_pods,
    parse_container_path,
    parse_pod_path,
)
from memdiag.system.process import parse_process

A = "a1" * 32  # 64 hex digits: a container id
B = "a1a1" + "b2" * 30  # shares its first 4 digits with A
C = "0f" * 32
UID = "1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
UID_ = UID.replace("-", "_")
MiB = 1 << 20

# (path, runtime, the container's own path, pod uid, qos)
LAYOUTS = [
    # podman, systemd driver (cgroup v2), as root and rootless, and in a podman pod
    (f"/machine.slice/libpod-{A}.scope", "podman", f"/machine.slice/libpod-{A}.scope", None, None),
    (f"/machine.slice/libpod-{A}.scope/container", "podman", f"/machine.slice/libpod-{A}.scope", None, None),
    (
        f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope",
        "podman",
        f"/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{A}.scope",
        None,
        None,
    ),
    (
        f"/machine.slice/machine-libpod_pod_{C}.slice/libpod-{A}.scope",
        "podman",
        f"/machine.slice/machine-libpod_pod_{C}.slice/libpod-{A}.scope",
        None,
        None,
    ),
    # podman, cgroupfs driver (this machine: v1)
    (f"/libpod_parent/libpod-{A}", "podman", f"/libpod_parent/libpod-{A}", None, None),
    # Docker: systemd and cgroupfs drivers
    (f"/system.slice/docker-{A}.scope", "docker", f"/system.slice/docker-{A}.scope", None, None),
    (f"/docker/{A}", "docker", f"/docker/{A}", None, None),
    (f"/docker/{A}/init.scope", "docker", f"/docker/{A}", None, None),
    # Kubernetes, systemd driver: burstable, besteffort, guaranteed (no qos slice); containerd, CRI-O
    (
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{A}.scope",
        "containerd",
        f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{A}.scope",
        UID,
        "burstable",
    ),
    (
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{A}.scope",
        "cri-o",
        f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{A}.scope",
        UID,
        "besteffort",
    ),
    (
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{A}.scope/container",
        "cri-o",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-{A}.scope",
        UID,
        "guaranteed",
    ),
    (
        f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{A}.scope",
        "docker",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/docker-{A}.scope",
        UID,
        "guaranteed",
    ),
    # Kubernetes, cgroupfs driver: the path does not say which runtime
    (f"/kubepods/burstable/pod{UID}/{A}", "unknown", f"/kubepods/burstable/pod{UID}/{A}", UID, "burstable"),
    (f"/kubepods/pod{UID}/{A}", "unknown", f"/kubepods/pod{UID}/{A}", UID, "guaranteed"),
    # kind: the kubelet's tree inside a node container
    (
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope",
        "containerd",
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{A}.scope",
        UID,
        "besteffort",
    ),
]


@pytest.mark.parametrize("path, runtime, own, uid, qos", LAYOUTS)
def test_parse_container_path(path, runtime, own, uid, qos):
    c = parse_container_path(path)
    assert (c.runtime, c.id, c.path, c.pod_uid, c.qos) == (runtime, A, own, uid, qos)


@pytest.mark.parametrize(
    "path",
    [
        f"/libpod_parent/libpod-conmon-{A}",  # podman's monitor, beside the container
        f"/machine.slice/libpod-conmon-{A}.scope",
        f"/kubepods.slice/kubepods-pod{UID_}.slice/crio-conmon-{A}.scope",  # CRI-O's monitor
        "/process_api/0123456789abcdef0123456789abcdef",  # a harness cgroup: 32 hex, no container
        f"/docker/{A[:63]}",  # one digit short
        f"/docker/{A.upper()}",  # runtimes write lower case
        f"/memdiag-test-x{A}",  # a folder that merely contains an id
        f"/memdiag-test-{A}-backup",
        f"/system.slice/podman-{A}.scope",  # not a runtime's container prefix
        f"/kubepods.slice/kubepods-pod{UID_}.slice",  # the pod, not a container
        "/",
        "",
    ],
)
def test_not_a_container(path):
    assert parse_container_path(path) is None


def test_container_in_a_container_is_the_inner_one():
    c = parse_container_path(f"/docker/{A}/docker/{C}")
    assert (c.runtime, c.id, c.path) == ("docker", C, f"/docker/{A}/docker/{C}")


@pytest.mark.parametrize(
    "path, expected",
    [
        (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice", (UID, "burstable")),
        (f"/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{A}.scope", (UID, "guaranteed")),
        (f"/kubepods/besteffort/pod{UID}", (UID, "besteffort")),
        (f"/kubepods/pod{UID}/{A}", (UID, "guaranteed")),
        ("/kubepods/pod0123456789abcdef0123456789abcdef", ("0123456789abcdef0123456789abcdef", "guaranteed")),
        (f"/pod{UID}", None),  # cgroupfs's bare pod<uid> counts only under kubepods
        (f"/libpod_parent/libpod-{A}", None),
        (f"/kubepods/burstable/pod{UID[:-1]}", None),
    ],
)
def test_parse_pod_path(path, expected):
    assert parse_pod_path(path) == expected


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cgroup(root: Path, path: str, version: int, limit: int | None = None, procs: list[int] = ()) -> None:
    folder = root / path.lstrip("/")
    folder.mkdir(parents=True, exist_ok=True)
    if version == 2:
        _write(folder / "memory.max", f"{limit}\n" if limit is not None else "max\n")
        _write(folder / "memory.current", "0\n")
    else:
        _write(folder / "memory.limit_in_bytes", f"{limit if limit is not None else 9223372036854771712}\n")
    _write(folder / "cgroup.procs", "".join(f"{p}\n" for p in procs))


def _proc(root: Path, pid: int, nspid: list[int]) -> None:
    _write(root / str(pid) / "status", f"Name:\tleak\nPid:\t{pid}\nNSpid:\t" + "\t".join(map(str, nspid)) + "\n")


@pytest.fixture
def v1_podman(tmp_path):
    """This machine's layout: podman with cgroupfs on the v1 memory hierarchy, conmon beside each
    container, a harness cgroup of 32 hex digits. Container A runs pid 4242 (pid 1 inside) and a
    child 4250; B a single process; C has a 64 MiB limit and nothing running."""
    mount, proc = tmp_path / "memory", tmp_path / "proc"
    _cgroup(mount, "/", 1)
    _cgroup(mount, "/libpod_parent", 1)
    _cgroup(mount, f"/libpod_parent/libpod-{A}", 1, 256 * MiB, [4250, 4242])
    _cgroup(mount, f"/libpod_parent/libpod-conmon-{A}", 1, None, [4240])
    _cgroup(mount, f"/libpod_parent/libpod-{B}", 1, None, [5000])
    _cgroup(mount, f"/libpod_parent/libpod-{C}", 1, 64 * MiB)
    _cgroup(mount, "/process_api/0123456789abcdef0123456789abcdef", 1, None, [7000])
    _proc(proc, 4242, [4242, 1])
    _proc(proc, 4250, [4250, 7])
    _proc(proc, 4240, [4240])
    _proc(proc, 5000, [5000, 1])
    return mount, proc


def test_list_containers_leaves_out_conmon_and_the_harness(v1_podman):
    mount, _ = v1_podman
    found = list_containers(mount)
    assert [(c.runtime, c.id) for c in found] == [("podman", C), ("podman", A), ("podman", B)]  # by path
    assert found[1].path == f"/libpod_parent/libpod-{A}"


def test_resolve_by_full_id_scheme_and_prefix(v1_podman):
    mount, proc = v1_podman
    for ref in (A, f"docker://{A}", A[:12], A[:5]):
        c = resolve_container(ref, mount=mount, clis=(), proc_root=proc)
        assert (c.id, c.runtime, c.cgroup) == (A, "podman", f"/libpod_parent/libpod-{A}"), ref
        assert c.limit_bytes == 256 * MiB and c.host_pid == 4242 and c.name is None
    c = resolve_container(C[:6], mount=mount, clis=(), proc_root=proc)
    assert c.id == C and c.limit_bytes == 64 * MiB and c.host_pid is None  # nothing runs in it


def test_short_ambiguous_and_unknown_references(v1_podman):
    mount, proc = v1_podman
    with pytest.raises(AmbiguousTarget) as e:
        resolve_container("a1a1", mount=mount, clis=(), proc_root=proc)
    assert str(e.value) == f"--container a1a1: ambiguous, matches 2 containers: {A[:12]}, {B[:12]}"
    with pytest.raises(UsageError) as e:
        resolve_container("a1a", mount=mount, clis=(), proc_root=proc)
    assert str(e.value) == "--container a1a: an id prefix needs at least 4 hex digits"
    with pytest.raises(UnknownTarget) as e:
        resolve_container("web", mount=mount, clis=(), proc_root=proc)
    assert str(e.value) == (
        "--container web: no such running container; names need podman, docker or crictl, none is installed: "
        f"give the id (running: {C[:12]}, {A[:12]}, {B[:12]})"
    )
    with pytest.raises(UnknownTarget) as e:  # the harness cgroup's name is no container's id
        resolve_container("0123456789abcdef", mount=mount, clis=(), by_name=False, list_running=False)
    assert str(e.value) == "--container 0123456789abcdef: no such running container"
    for bad in ("a b", "-x", "../etc", "", "x" * 300):
        with pytest.raises(UsageError) as e:
            resolve_container(bad, mount=mount, clis=(), proc_root=proc)
        assert str(e.value).endswith("not a container id or name (letters, digits, '_', '.', '-')"), bad


def test_one_id_in_two_cgroups_lists_the_paths(tmp_path):
    mount = tmp_path / "memory"
    _cgroup(mount, f"/system.slice/docker-{A}.scope", 2)
    _cgroup(mount, f"/evil/crio-{A}.scope", 2)
    with pytest.raises(AmbiguousTarget) as e:
        resolve_container(A, mount=mount, clis=(), proc_root=tmp_path)
    assert str(e.value) == (
        f"--container {A}: ambiguous, matches 2 containers: /evil/crio-{A}.scope, /system.slice/docker-{A}.scope"
    )


def test_container_of_cgroup(v1_podman):
    mount, proc = v1_podman
    c = container_of_cgroup(f"/libpod_parent/libpod-{A}", mount=mount, clis=(), proc_root=proc)
    assert (c.id, c.host_pid, c.limit_bytes) == (A, 4242, 256 * MiB)
    assert container_of_cgroup(f"/libpod_parent/libpod-conmon-{A}", mount=mount, clis=()) is None
    assert container_of_cgroup("/process_api/0123456789abcdef0123456789abcdef", mount=mount, clis=()) is None


@pytest.fixture
def v2_kubernetes(tmp_path):
    """A v2 node, systemd driver: a burstable pod with a containerd container (its processes one
    folder down, as with cgroup v2 nesting) and its pause container; a guaranteed CRI-O pod; and
    a Docker container outside Kubernetes."""
    mount, proc = tmp_path / "cgroup", tmp_path / "proc"
    pod = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
    _cgroup(mount, "/kubepods.slice/kubepods-burstable.slice", 2)
    _cgroup(mount, pod, 2, 512 * MiB)
    _cgroup(mount, f"{pod}/cri-containerd-{A}.scope", 2, 256 * MiB)
    _cgroup(mount, f"{pod}/cri-containerd-{A}.scope/container", 2, None, [300, 301])
    _cgroup(mount, f"{pod}/cri-containerd-{C}.scope", 2, None, [290])  # the pause container
    other = "2e3d4c5b-6a7f-4b9c-8d1e-2f3a4b5c6d7e"
    _cgroup(mount, f"/kubepods.slice/kubepods-pod{other.replace('-', '_')}.slice/crio-{B}.scope", 2, 128 * MiB, [400])
    _cgroup(mount, f"/kubepods.slice/kubepods-pod{other.replace('-', '_')}.slice/crio-conmon-{B}.scope", 2, None)
    _cgroup(mount, f"/system.slice/docker-{'d4' * 32}.scope", 2, None, [500])
    _proc(proc, 300, [300, 1])
    _proc(proc, 301, [301, 12])
    _proc(proc, 290, [290, 1])
    return mount, proc, pod, other


def test_v2_kubernetes_tree(v2_kubernetes):
    mount, proc, pod, other = v2_kubernetes
    assert (
        [(c.runtime, c.id[:4], c.pod_uid, c.qos) for c in list_containers(mount)]
        == [
            ("containerd", C[:4], UID, "burstable"),  # sorted by path
            ("containerd", A[:4], UID, "burstable"),
            ("cri-o", B[:4], other, "guaranteed"),
            ("docker", "d4d4", None, None),
        ]
    )
    assert [(p.uid, p.qos, p.path) for p in list_pods(mount)] == [
        (UID, "burstable", pod),
        (other, "guaranteed", f"/kubepods.slice/kubepods-pod{other.replace('-', '_')}.slice"),
    ]
    c = resolve_container(A[:8], mount=mount, clis=(), proc_root=proc)
    assert (c.cgroup, c.pod_uid, c.limit_bytes, c.host_pid) == (f"{pod}/cri-containerd-{A}.scope", UID, 256 * MiB, 300)


def test_resolve_pod_by_uid(v2_kubernetes):
    mount, proc, pod, _ = v2_kubernetes
    for uid in (UID, UID_):
        info = resolve_pod(None, None, uid, mount=mount, clis=(), proc_root=proc)
        assert (info.uid, info.qos, info.cgroup, info.limit_bytes) == (UID, "burstable", pod, 512 * MiB)
        assert [(c.id, c.host_pid) for c in info.containers] == [(C, 290), (A, 300)]
    with pytest.raises(UnknownTarget) as e:
        resolve_pod(None, None, "9" * 32, mount=mount, clis=())
    assert str(e.value) == f"pod {'9' * 32}: no cgroup of this pod on this host"
    with pytest.raises(UsageError) as e:
        resolve_pod("shop", "orderd-5d8f", None, mount=mount, clis=())
    assert str(e.value) == "pod orderd-5d8f: pod names need crictl, which is not installed here: give the pod's uid"
    with pytest.raises(UsageError) as e:
        resolve_pod(None, None, "../x", mount=mount, clis=())
    assert str(e.value) == "pod uid '../x': not a pod uid"


def test_cgroupfs_kubelet_and_docker_v1(tmp_path):
    mount = tmp_path / "memory"
    _cgroup(mount, f"/kubepods/besteffort/pod{UID}/{A}", 1, None, [10])
    _cgroup(mount, f"/kubepods/pod{UID.replace('1d', '2d')}/{B}", 1, 100 * MiB)
    _cgroup(mount, f"/docker/{C}", 1, 32 * MiB, [20])
    found = {c.id: c for c in list_containers(mount)}
    assert (found[A].runtime, found[A].pod_uid, found[A].qos) == ("unknown", UID, "besteffort")
    assert (found[B].runtime, found[B].qos) == ("unknown", "guaranteed")
    assert (found[C].runtime, found[C].path) == ("docker", f"/docker/{C}")
    info = resolve_pod(None, None, UID, mount=mount, clis=(), proc_root=tmp_path)
    assert (info.cgroup, info.qos, [c.id for c in info.containers]) == (
        f"/kubepods/besteffort/pod{UID}",
        "besteffort",
        [A],
    )
    assert resolve_container(C[:5], mount=mount, clis=(), proc_root=tmp_path).limit_bytes == 32 * MiB


def test_nspid_in_the_process_reader():
    status = "Name:\tleak\nState:\tS (sleeping)\nPid:\t4242\nNSpid:\t4242\t17\t1\nVmRSS:\t  100 kB\n"
    assert parse_process(4242, status, None, None, None).ns_pid == 1  # the innermost namespace's
    assert parse_process(7, "Name:\tsh\nPid:\t7\nNSpid:\t7\n", None, None, None).ns_pid == 7
    assert parse_process(7, "Name:\tsh\nPid:\t7\n", None, None, None).ns_pid is None  # before 4.1


# The runtime CLIs' JSON, in their documented shapes (podman's as podman 4.3 writes it here).
PODMAN_PS = [
    {
        "Id": A,
        "Image": "localhost/orderd:latest",
        "Names": ["orderd"],
        "Pid": 4242,
        "Pod": "",
        "PodName": "",
        "Labels": None,
        "State": "running",
    },
    {"Id": B, "Names": ["web"], "Pid": 0, "Labels": {"io.kubernetes.pod.name": "web-1"}},
    {"Names": ["no-id"]},  # a shape this version does not know: left out
    "junk",
]
DOCKER_INSPECT = [
    {
        "Id": C,
        "Name": "/k8s_orderd_orderd-5d8f7_shop_" + UID + "_0",
        "State": {"Status": "running", "Pid": 777},
        "Config": {
            "Image": "registry.example/shop/orderd:1.4",
            "Labels": {
                "io.kubernetes.pod.name": "orderd-5d8f7",
                "io.kubernetes.pod.namespace": "shop",
                "io.kubernetes.pod.uid": UID,
            },
        },
    }
]
CRICTL_PS = {
    "containers": [
        {
            "id": A,
            "podSandboxId": C,
            "metadata": {"name": "orderd", "attempt": 0},
            "image": {"image": "sha256:" + "e5" * 32},
            "imageRef": "registry.example/shop/orderd@sha256:" + "e5" * 32,
            "state": "CONTAINER_RUNNING",
            "labels": {
                "io.kubernetes.container.name": "orderd",
                "io.kubernetes.pod.name": "orderd-5d8f7",
                "io.kubernetes.pod.namespace": "shop",
                "io.kubernetes.pod.uid": UID,
            },
        },
        {"id": B, "metadata": None, "image": {"image": "docker.io/library/redis:7"}, "labels": {}},
    ]
}
CRICTL_PODS = {
    "items": [
        {"id": C, "metadata": {"name": "orderd-5d8f7", "uid": UID, "namespace": "shop", "attempt": 0}},
        {"id": B, "metadata": {"name": "half"}},  # no uid: left out
    ]
}


def test_runtime_cli_listings():
    from memdiag.diagnose.containers import (
        parse_crictl_pods,
        parse_crictl_ps,
        parse_docker_inspect,
        parse_podman_ps,
    )

    def shown(rows):
        return [(r.id[:4], r.names, r.image, r.runtime, r.pid, r.pod_uid, r.pod, r.namespace) for r in rows]

    assert shown(parse_podman_ps(PODMAN_PS)) == [
        ("a1a1", ("orderd",), "localhost/orderd:latest", "podman", 4242, None, None, None),
        ("a1a1", ("web",), None, "podman", None, None, "web-1", None),
    ]
    assert shown(parse_docker_inspect(DOCKER_INSPECT)) == [
        (
            "0f0f",
            (f"k8s_orderd_orderd-5d8f7_shop_{UID}_0",),
            "registry.example/shop/orderd:1.4",
            "docker",
            777,
            UID,
            "orderd-5d8f7",
            "shop",
        ),
    ]
    assert shown(parse_crictl_ps(CRICTL_PS)) == [
        (
            "a1a1",
            ("orderd",),
            "registry.example/shop/orderd@sha256:" + "e5" * 32,
            "unknown",
            None,
            UID,
            "orderd-5d8f7",
            "shop",
        ),
        ("a1a1", ("",), "docker.io/library/redis:7", "unknown", None, None, None, None),
    ]
    assert [(p.uid, p.name, p.namespace) for p in parse_crictl_pods(CRICTL_PODS)] == [(UID, "orderd-5d8f7", "shop")]
    for nothing in (None, {}, [], "x", {"containers": "x"}, {"items": [1, 2]}):
        assert parse_podman_ps(nothing) == parse_crictl_ps(nothing) == parse_crictl_pods(nothing) == []


def test_a_v2_container_s_processes_one_folder_down(v2_kubernetes):
    """cgroup v2 keeps a scope that delegates to a leaf free of processes: the container's are the
    leaf's. A folder with processes of its own is read alone (v1, and v2 leaves)."""
    from memdiag.system.cgroup import cgroup_pids

    mount, _, pod, _ = v2_kubernetes
    scope = mount / pod.lstrip("/") / f"cri-containerd-{A}.scope"
    assert cgroup_pids(scope) == [300, 301]
    assert cgroup_pids(mount / pod.lstrip("/")) == [290, 300, 301]  # the pod: all its containers
    _write(scope / "cgroup.procs", "299\n")
    assert cgroup_pids(scope) == [299]
    assert cgroup_pids(mount / "no-such-folder") == []


def test_a_container_in_a_pod_in_a_container_is_in_the_inner_pod():
    """kind or a kubelet inside a pod nests pods: a container's pod is the innermost one above it
    (the review found the outer pod named for the inner container)."""
    outer, inner = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
    a, b = "a" * 64, "b" * 64
    outer_path = f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{outer.replace('-', '_')}.slice"
    path = (
        f"{outer_path}/cri-containerd-{a}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{inner.replace('-', '_')}.slice/"
        f"cri-containerd-{b}.scope"
    )
    c = parse_container_path(path)
    assert (c.id, c.pod_uid, c.qos) == (b, inner, "besteffort")
    c = parse_container_path(f"{outer_path}/cri-containerd-{a}.scope")
    assert (c.id, c.pod_uid, c.qos) == (a, outer, "burstable")
    assert parse_pod_path(path) == (inner, "besteffort")


def test_podman_names_as_one_string_is_one_name():
    """podman 1.x writes Names as a string: one name, not its letters."""
    from memdiag.diagnose.containers import parse_podman_ps

    [row] = parse_podman_ps([{"Id": "a" * 64, "Names": "web"}])
    assert row.names == ("web",)
    [row] = parse_podman_ps([{"Id": "a" * 64, "Names": [1, "web"]}])
    assert row.names == ("web",)


def test_odd_runtime_output_is_no_listing(tmp_path):
    """A CLI writing bytes that are not UTF-8 or JSON nested past the parser's depth lists nothing,
    and raises nothing (it killed the OOM watch's thread)."""
    from memdiag.diagnose import containers

    for name, body in (("deep", "[" * 100_000 + "]" * 100_000), ("bytes", None)):
        exe = tmp_path / name
        out = "printf '\\377\\376{'" if body is None else f"cat {tmp_path / 'deep.json'}"
        if body is not None:
            (tmp_path / "deep.json").write_text(body)
        exe.write_text(f"#!/bin/sh\n{out}\n")
        exe.chmod(0o755)
        assert containers._run_json([str(exe)]) is None
