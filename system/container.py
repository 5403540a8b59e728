"""What a cgroup path says about a container or a Kubernetes pod, from the folder names the runtimes
and the kubelet write (their documented formats), in cgroup v1 and v2, systemd and cgroupfs drivers:

  podman      /machine.slice/libpod-<id>.scope            (systemd; also under user@UID.service)
              /libpod_parent/libpod-<id>                   (cgroupfs)
              libpod-conmon-<id>[.scope] is podman's monitor process, not the container
  Docker      /system.slice/docker-<id>.scope              (systemd)
              /docker/<id>                                 (cgroupfs)
  Kubernetes  /kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/
                  cri-containerd-<id>.scope | crio-<id>.scope | docker-<id>.scope
              (a guaranteed pod has no qos slice: /kubepods.slice/kubepods-pod<uid>.slice/...)
              /kubepods/<qos>/pod<uid>/<id>, /kubepods/pod<uid>/<id>   (cgroupfs)

A folder inside a container's own folder (`.../libpod-<id>.scope/container` with v2 nesting,
`init.scope`) belongs to that container. Ids are 64 hex digits, as every one of these runtimes
writes them: a shorter hex name (a harness's `/process_api/<32 hex>`) is no container.
Pure: reads folder names only, never runs anything. ContainerInfo and PodInfo are what a container
or pod is once resolved (diagnose/containers.py asks the runtimes' CLIs): the target carries them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict

from ._parse import Model
from .cgroup import cgroup_folders

Runtime = Literal["podman", "docker", "containerd", "cri-o", "unknown"]

_ID = r"[0-9a-f]{64}"
# `<prefix>-<id>[.scope]` -> runtime; conmon's folders (`libpod-conmon-`, `crio-conmon-`) do not
# match: the prefix must be the whole text before the id.
_SCOPED = re.compile(rf"^(libpod|docker|cri-containerd|crio)-({_ID})(?:\.scope)?$")
_PREFIX_RUNTIME: dict[str, Runtime] = {
    "libpod": "podman",
    "docker": "docker",
    "cri-containerd": "containerd",
    "crio": "cri-o",
}
_BARE = re.compile(rf"^({_ID})$")
# A pod uid: a UUID, or for a static pod the kubelet's 32-hex config hash.
_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
# systemd driver: `kubepods[-<qos>]-pod<uid with _>.slice`, possibly under a prefix (kind's
# `kubelet-kubepods-...`), cgroupfs driver: `pod<uid>`.
# What users and alerts name: a pod uid (dashes or the systemd slice's underscores), a container id
# or name as Docker and podman accept it, and Kubernetes' `<runtime>://` before an id. One home for
# the CLI's and serve's checks (use with fullmatch / sub).
POD_UID = re.compile(_UID)
CONTAINER_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
ID_SCHEME = re.compile(r"^(?:docker|containerd|cri-o)://")
_POD_SLICE = re.compile(rf"^(?:[a-z0-9_]+-)*kubepods(?:-(burstable|besteffort))?-pod({_UID})\.slice$")
_POD_DIR = re.compile(rf"^pod({_UID})$")
_QOS = ("burstable", "besteffort")


class ContainerCgroup(Model):
    """A container as its cgroup path shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    runtime: Runtime
    id: str  # the full hex id as the runtime wrote it in the path
    path: str  # the container's own cgroup path inside the memory hierarchy
    pod_uid: str | None = None  # Kubernetes pod uid (with dashes), when under kubepods
    qos: str | None = None  # guaranteed / burstable / besteffort


def _steps(path: str) -> list[str]:
    return [s for s in path.split("/") if s]


def _dashed(uid: str) -> str:
    return uid.replace("_", "-")


def _is_kubepods(step: str) -> bool:
    return step == "kubepods" or (step.endswith(".slice") and step[: -len(".slice")].split("-")[-1] == "kubepods")


def _pod_at(steps: list[str], before: int | None = None) -> tuple[int, str, str | None] | None:
    """(index of the pod's step, uid with dashes, qos) of the innermost pod folder in the path, or
    in its first `before` steps (a container's own pod: kind or a kubelet inside a pod nests pods)."""
    found = None
    for i, step in enumerate(steps[:before]):
        # systemd's slice names carry their parents (a-b-c.slice is in a-b.slice): the slice itself
        # says kubepods; the cgroupfs driver's bare pod<uid> counts only under a kubepods folder.
        if m := _POD_SLICE.match(step):
            found = i, _dashed(m.group(2)), m.group(1) or "guaranteed"
        elif any(_is_kubepods(s) for s in steps[:i]) and (m := _POD_DIR.match(step)):
            parent = steps[i - 1]
            found = i, _dashed(m.group(1)), parent if parent in _QOS else "guaranteed"
    return found


def parse_pod_path(path: str) -> tuple[str, str | None] | None:
    """(pod uid with dashes, qos) of the Kubernetes pod this cgroup path is or is inside; None otherwise."""
    found = _pod_at(_steps(path))
    return None if found is None else (found[1], found[2])


def _container_step(steps: list[str], i: int) -> tuple[Runtime, str] | None:
    step = steps[i]
    if m := _SCOPED.match(step):
        return _PREFIX_RUNTIME[m.group(1)], m.group(2)
    if m := _BARE.match(step):
        # /docker/<id> is Docker's; the cgroupfs kubelet's /kubepods/.../pod<uid>/<id> is
        # containerd's or CRI-O's alike, and a --cgroup-parent is the user's choice: the path alone
        # does not tell those runtimes apart.
        return ("docker" if i and steps[i - 1] == "docker" else "unknown"), m.group(1)
    return None


def parse_container_path(path: str) -> ContainerCgroup | None:
    """The container a cgroup path is, or is inside (the innermost, for a container in a container)."""
    steps = _steps(path)
    for i in range(len(steps) - 1, -1, -1):
        found = _container_step(steps, i)
        if found is None:
            continue
        pod = _pod_at(steps, before=i)  # the container's own pod: the innermost one above it
        return ContainerCgroup(
            runtime=found[0],
            id=found[1],
            path="/" + "/".join(steps[: i + 1]),
            pod_uid=pod[1] if pod else None,
            qos=pod[2] if pod else None,
        )
    return None


def list_containers(mount: Path) -> list[ContainerCgroup]:
    """Every container whose own folder is in this memory hierarchy folder (a v1 memory mount or
    the v2 root), sorted by path; folders inside a container are not listed again."""
    found = [c for path in cgroup_folders(mount) if (c := parse_container_path(path)) is not None and c.path == path]
    return sorted(found, key=lambda c: c.path)


class PodCgroup(Model):
    """A Kubernetes pod as its cgroup path shows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uid: str  # with dashes
    qos: str | None = None
    path: str  # the pod's own cgroup path inside the memory hierarchy


def pod_cgroup(path: str) -> PodCgroup | None:
    """The pod a cgroup path is or is inside, with the pod's own folder."""
    steps = _steps(path)
    found = _pod_at(steps)
    if found is None:
        return None
    return PodCgroup(uid=found[1], qos=found[2], path="/" + "/".join(steps[: found[0] + 1]))


def list_pods(mount: Path) -> list[PodCgroup]:
    """Every Kubernetes pod whose own folder is in this memory hierarchy folder, sorted by path."""
    pods = [p for path in cgroup_folders(mount) if (p := pod_cgroup(path)) is not None and p.path == path]
    return sorted(pods, key=lambda p: p.path)


class ContainerInfo(Model):
    """A running container: its cgroup, and what its runtime says of it when asked."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str  # full, 64 hex
    name: str | None = None
    image: str | None = None
    runtime: Runtime
    cgroup: str  # the container's own path inside the memory hierarchy
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None
    host_pid: int | None = None  # the container's main process, as the host numbers it
    limit_bytes: int | None = None  # the container's own memory limit; None: unlimited

    @property
    def short_id(self) -> str:
        return self.id[:12]

    def describe(self) -> str:
        return f"container {self.name} ({self.short_id})" if self.name else f"container {self.short_id}"


class PodInfo(Model):
    """A Kubernetes pod: its cgroup (every container of the pod below it) and its containers."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    uid: str
    name: str | None = None
    namespace: str | None = None
    qos: str | None = None
    cgroup: str
    limit_bytes: int | None = None
    containers: list[ContainerInfo] = []

    def describe(self) -> str:
        named = f"{self.namespace}/{self.name}" if self.name else self.uid
        return f"pod {named}"
