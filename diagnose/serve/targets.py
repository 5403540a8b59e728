"""From alert labels to a target on this host, strictly: a label value is validated by pattern and
then only compared with what the host has (process ids, cgroup directories found by walking the
memory hierarchy); it is never used to build a file path or a command."""

from __future__ import annotations

import os
import re
from pathlib import Path

from memdiag.system.cgroup import cgroup_folders, memory_hierarchy
from memdiag.system.container import CONTAINER_REF, ID_SCHEME, POD_UID, pod_cgroup
from memdiag.system.process import ProcessGone, read_process

from ..containers import resolve_container, resolve_pod
from ..errors import AmbiguousTarget, UnknownTarget, UsageError
from ..target import Target, as_largest_process, cgroup_target, pid_target, system_target, with_container

PID = re.compile(r"^[1-9][0-9]{0,9}$")
CONTAINER = re.compile(r"^(?:(?:containerd|cri-o|docker)://)?([0-9a-f]{12,64})$")
# a UUID (either separator: the systemd driver writes _), or a static pod's 32-hex config hash
K8S_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?$")  # DNS-1123: namespaces, pods, containers
MIN_LABEL_PREFIX = 12  # a label's short id is the runtimes' 12-digit display form, never shorter
CGROUP_ID = re.compile(r"^/(?:[A-Za-z0-9_.:@=+-]+/)*[A-Za-z0-9_.:@=+-]*$")


class BadLabel(ValueError):
    """A label value that fails validation (422)."""


class NotOnHost(LookupError):
    """A valid label naming nothing on this host (404)."""


class Ambiguous(BadLabel):
    """A valid label naming more than one thing on this host (422, listing them)."""


def cgroup_dirs() -> list[str]:
    """Every cgroup of the memory hierarchy, as paths inside it (/kubepods/pod.../abc), the root first."""
    found = memory_hierarchy()
    return ["/", *cgroup_folders(Path(found[1].mount_point))] if found is not None else []


def _cgroup_path_ok(value: str) -> bool:
    """A cgroup named by its path in the hierarchy: allowed characters, no `.` or `..` steps."""
    absolute = value if value.startswith("/") else "/" + value
    return CGROUP_ID.fullmatch(absolute) is not None and not {".", ".."} & set(absolute.split("/"))


def cgroup_by_path(value: str) -> Target:
    """POST /diagnose's `cgroup`: whatever the CLI's --cgroup accepts (a path inside the memory
    hierarchy, with or without its leading '/', or the folder under its mount), checked by pattern
    first, then resolved by the CLI's own resolver (cgroup_target: symlinks, '..' and anything
    outside the mounted hierarchy refused), then taken as a label's cgroup is (_as_named)."""
    if not _cgroup_path_ok(value):
        raise BadLabel("cgroup: not a cgroup path (letters, digits, _.:@=+- and '/', no '.' or '..' steps)")
    try:
        target = cgroup_target(value)
    except UsageError as e:
        raise NotOnHost(f"cgroup: {str(e).removeprefix('--cgroup: ')}") from None
    return _as_named(target)


def _as_named(target: Target) -> Target:
    """A cgroup as serve diagnoses it. The root of the hierarchy is the whole host: the whole system
    is diagnosed (host-wide counters and probes; no process is traced or stopped, where the root
    cgroup's largest process, often init, would get memleak's uprobes and the reachability scan's
    ptrace stop). A Kubernetes pod's own cgroup (cAdvisor's pod-level series) is the pod."""
    loc = target.cgroup
    if loc is None:
        return target
    if os.path.realpath(loc.fs_path) == os.path.realpath(loc.mount_point):
        return system_target()
    pod = pod_cgroup(loc.path)
    if pod is not None and pod.path == loc.path.rstrip("/"):
        return target.model_copy(update={"pod": _resolved(lambda: resolve_pod(None, None, pod.uid))})
    return target


def _resolved(find):
    """A container or pod lookup with its errors in serve's terms: unknown 404, ambiguous and
    invalid 422 (the one line listing what matched)."""
    try:
        return find()
    except AmbiguousTarget as e:
        raise Ambiguous(str(e)) from None
    except UnknownTarget as e:
        raise NotOnHost(str(e)) from None
    except UsageError as e:
        raise BadLabel(str(e)) from None


def _label(labels: dict[str, str], key: str, pattern: re.Pattern, what: str) -> str | None:
    value = labels.get(key)
    if value is None or value == "":
        return None
    if not pattern.fullmatch(value):
        raise BadLabel(f"label {key}: not {what}")
    return value


def _pod_target(labels: dict[str, str]) -> Target | None:
    """A pod by uid, or by namespace and pod (kube-state-metrics, cAdvisor); `container` picks one
    of its containers (cAdvisor's "POD" and "" are the pod itself)."""
    uid = _label(labels, "uid", POD_UID, "a pod uid") or _label(labels, "pod_uid", POD_UID, "a pod uid")
    pod = _label(labels, "pod", K8S_NAME, "a pod name")
    if uid is None and pod is None:
        return None
    namespace = _label(labels, "namespace", K8S_NAME, "a namespace")
    info = _resolved(lambda: resolve_pod(namespace, pod, uid))
    # cAdvisor's "POD" (the sandbox) and "" are the pod itself; checked before the name's pattern
    sandbox = labels.get("container") in ("POD", "")
    member = None if sandbox else _label(labels, "container", K8S_NAME, "a container name")
    if member is None:
        return cgroup_target(info.cgroup).model_copy(update={"pod": info})
    chosen = [c for c in info.containers if c.name == member]
    if len(chosen) > 1:
        raise Ambiguous(f"label container: pod {info.uid} has {len(chosen)} running containers named {member}")
    if chosen:
        return cgroup_target(chosen[0].cgroup).model_copy(update={"container": chosen[0], "pod": info})
    if any(c.name for c in info.containers):
        raise NotOnHost(f"label container: pod {info.uid} has no running container named {member}")
    # Container names come from crictl only; without it, the pod (which holds the container) it is.
    return cgroup_target(info.cgroup).model_copy(update={"pod": info})


def container_by_ref(ref: str) -> Target:
    """POST /diagnose's `container`: a full id, a 12-digit or longer id prefix, or a name."""
    if not CONTAINER_REF.fullmatch(ID_SCHEME.sub("", ref)):
        raise BadLabel("container: not a container id or name (letters, digits, '_', '.', '-')")
    return as_largest_process(_container_target(ref, "container"))


def _container_target(ref: str, said: str, by_name: bool = True) -> Target:
    def find():
        return resolve_container(ref, min_prefix=MIN_LABEL_PREFIX, said=said, by_name=by_name, list_running=False)

    info = _resolved(find)
    return cgroup_target(info.cgroup).model_copy(update={"container": info})


def _cgroup_target(labels: dict[str, str]) -> Target:
    if "container_id" in labels:
        m = CONTAINER.fullmatch(labels["container_id"])
        if not m:
            raise BadLabel("label container_id: expected containerd://, cri-o:// or docker:// and a hex id")
        return _container_target(m.group(1), "label container_id", by_name=False)
    # cAdvisor's id is this host's own cgroup path: exact, and needs no runtime CLI, where a pod's
    # namespace and name do (crictl); it comes first when a series carries both.
    if "id" in labels:
        value = labels["id"]
        if not value.startswith("/") or not _cgroup_path_ok(value):
            raise BadLabel("label id: not a cgroup path")
        known = set(cgroup_dirs())
        if value.rstrip("/") not in known and value not in known:
            raise NotOnHost("label id: no such cgroup on this host")
        return _as_named(cgroup_target(value))
    pod = _pod_target(labels)
    if pod is not None:
        return pod
    if "name" in labels:
        name = _label(labels, "name", CONTAINER_REF, "a container name") or ""
        return _container_target(name, "label name")
    raise BadLabel("no label names a target: give pid, container_id, uid, namespace and pod, id or name")


def target_from_labels(labels: dict[str, str]) -> Target:
    """pid; container_id; cAdvisor's id (a cgroup path; "/" is the whole system); a pod by uid, or by
    namespace and pod (with container: one of its containers); name (a container's). Within a
    cgroup the process diagnosed is the largest by RSS, unless a pid was named; the target carries
    its container and pod, whichever label named it."""
    if "pid" in labels:
        value = labels["pid"]
        if not PID.fullmatch(value):
            raise BadLabel("label pid: not a process id")
        try:
            read_process(int(value))
        except ProcessGone:
            raise NotOnHost(f"label pid: no process {int(value)} on this host") from None
        return with_container(pid_target(int(value)))
    return as_largest_process(_cgroup_target(labels))
