"""deploy/kubernetes: every manifest valid against the Kubernetes schemas (offline, the ones
kubernetes-validate bundles; a wrong field fails), the DaemonSet's promises kept (not privileged,
hostPID, the host mounts, the node name), its command line one that memdiag serve really starts
with, and the Alertmanager example accepted by the real amtool."""

from __future__ import annotations

import copy
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kit import MEMDIAG

K8S = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSION = "1.30.0"  # the oldest version with appArmorProfile in the pod spec's schema
MANIFESTS = sorted(K8S.glob("*.yaml"))


def _load(name: str) -> dict:
    return yaml.safe_load((K8S / name).read_text())


def _container() -> dict:
    return _load("daemonset.yaml")["spec"]["template"]["spec"]["containers"][0]


def test_every_manifest_validates_strictly():
    kinds = set()
    for path in MANIFESTS:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
        assert docs, path.name
        for doc in docs:
            for version in (VERSION, kubernetes_validate.latest_version()):
                kubernetes_validate.validate(doc, version, strict=True)
            kinds.add(doc["kind"])
    assert kinds == {"Namespace", "ServiceAccount", "Secret", "Service", "DaemonSet"}


@pytest.mark.parametrize(
    "path, value, says",
    [
        (["spec", "template", "spec", "hostPid"], True, "'hostPid' was unexpected"),
        (["spec", "template", "spec", "containers", 0, "securityContext", "capabilities", "add"], "BPF", "not of type"),
        (["spec", "template", "spec", "volumes", 1, "hostPath", "type"], 7, "not of type"),
    ],
)
def test_a_broken_copy_fails(path, value, says):
    doc = copy.deepcopy(_load("daemonset.yaml"))
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(kubernetes_validate.ValidationError, match=says):
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_daemonset_is_not_privileged_and_mounts_the_host():
    pod = _load("daemonset.yaml")["spec"]["template"]["spec"]
    c = _container()
    sc = c["securityContext"]
    assert pod["hostPID"] is True and "hostNetwork" not in pod
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {"BPF", "PERFMON", "SYS_PTRACE", "SYS_ADMIN", "SYS_RESOURCE", "SYSLOG"}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    host = ("/sys/kernel/tracing", "/sys/kernel/debug", "/sys/fs/cgroup", "/lib/modules", "/usr/src")
    host += ("/var/lib/memdiag",)
    for path in host:
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path
    for path in ("/sys/fs/cgroup", "/lib/modules", "/usr/src", "/etc/memdiag"):
        assert mounts[path]["readOnly"] is True
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz?scope=process", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert "--node=$(NODE_NAME)" in c["args"]  # the kubelet expands it from the env var checked above
    assert c["resources"]["limits"]["memory"] == "512Mi"


def test_no_rbac_and_no_api_token():
    docs = [d for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]
    assert not [d for d in docs if d["kind"] in {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}]
    assert _load("serviceaccount.yaml")["automountServiceAccountToken"] is False
    pod = _load("daemonset.yaml")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "memdiag" and pod["automountServiceAccountToken"] is False


def test_service_selects_the_agent_and_secret_has_the_files_serve_reads():
    svc = _load("service.yaml")["spec"]
    ds = _load("daemonset.yaml")
    assert svc["selector"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert svc["clusterIP"] == "None"
    assert svc["ports"][0]["targetPort"] in {p["name"] for p in _container()["ports"]}
    secret = _load("secret.yaml")
    files = {f"/etc/memdiag/{k}" for k in secret["stringData"]}
    args = dict(a.split("=", 1) for a in _container()["args"][1:])
    assert {args["--token-file"], args["--read-token-file"]} == files
    vol = next(v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == "token")
    assert vol["secret"]["secretName"] == secret["metadata"]["name"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.mark.bpf  # it starts the real `memdiag serve`, which runs as root
def test_daemonset_command_line_starts_memdiag_serve(tmp_path):
    """The DaemonSet's args, with its paths moved under tmp_path, the Secret's files at the
    Secret's defaultMode and loopback for the address: serve starts, /healthz answers the liveness
    probe, /metrics answers the Service's scrape with the read token and refuses it without."""
    mode = next(v for v in _load("daemonset.yaml")["spec"]["template"]["spec"]["volumes"] if v["name"] == "token")
    port = _free_port()
    args = []
    for arg in _container()["args"]:
        key, _, value = arg.partition("=")
        if key == "--listen":
            value = f"127.0.0.1:{port}"
        elif key == "--node":
            value = value.replace("$(NODE_NAME)", "node-a")  # as the kubelet expands it
        elif key == "--alertmanager":
            value = f"http://127.0.0.1:{_free_port()}"  # none there: the agent starts all the same
        elif value.startswith("/"):
            value = str(tmp_path / value.lstrip("/"))
            if key.endswith("token-file"):
                Path(value).parent.mkdir(parents=True, exist_ok=True)
                Path(value).write_text(f"tok-{Path(value).name}\n")
                Path(value).chmod(mode["secret"]["defaultMode"])
        args.append(f"{key}={value}" if value else key)
    # the OOM watch loads a BPF probe: not what this test is about, and the suite shares the kernel
    proc = subprocess.Popen([MEMDIAG, *args, "--no-oom-watch"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        status = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = _get(f"http://127.0.0.1:{port}/healthz")[0]
                break
            except OSError:
                time.sleep(0.2)
        assert status == 200, proc.stderr.read().decode() if proc.poll() is not None else status
        code, body = _get(f"http://127.0.0.1:{port}/metrics", token="tok-read-token")
        assert code == 200 and b"memdiag_" in body
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 401
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_alertmanager_example_passes_amtool():
    if shutil.which("amtool") is None:
        pytest.skip("amtool missing: scripts/setup.sh --test installs prometheus-alertmanager")
    done = subprocess.run(
        ["amtool", "check-config", str(K8S / "alertmanager-config.example.yml")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout and " - 3 receivers" in done.stdout
    config = yaml.safe_load((K8S / "alertmanager-config.example.yml").read_text())
    memdiag = config["route"]["routes"][0]
    assert memdiag["matchers"] == ['memdiag_target!="none"', 'memdiag_target!=""'] and memdiag["group_by"] == ["..."]
    assert all(r["matchers"][0].startswith('node="') for r in memdiag["routes"])


EXAMPLE = "kubernetes/alertmanager-config.example.yml"


@pytest.mark.parametrize(
    "config, labels, receiver",
    [
        (EXAMPLE, ["memdiag_target=pid", "pid=42", "node=node-b"], "memdiag-node-b"),
        (EXAMPLE, ["memdiag_target=id", "id=/x", "node=node-a"], "memdiag-node-a"),
        (EXAMPLE, ["memdiag_target=none", "node=node-a"], "default"),
        (EXAMPLE, ["node=node-a"], "default"),
        ("alertmanager-receiver.yml", ["alertname=MemoryProcessGrowth", "memdiag_target=pid", "pid=42"], "memdiag"),
        ("alertmanager-receiver.yml", ["alertname=MemoryProcessGroupGrowth", "memdiag_target=none"], "default"),
    ],
)
def test_alertmanager_routes_alerts_with_a_target_to_their_node(config, labels, receiver):
    """amtool's own router: an alert memdiag can take goes to its node's agent, one it cannot to people."""
    if shutil.which("amtool") is None:
        pytest.skip("amtool missing: scripts/setup.sh --test installs prometheus-alertmanager")
    path = K8S.parent / config
    done = subprocess.run(
        ["amtool", "config", "routes", "test", f"--config.file={path}", *labels], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == receiver
