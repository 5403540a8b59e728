"""From alert labels to a target on this host, strictly: a label value is validated by pattern and
then only compared with what the host has (process ids, cgroup directories found by walking the
memory hierarchy); it is never used to build a file path or a command."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..facts.cgroup import CgroupLocation, parse_mountinfo
from ..facts.process import ProcessGone, read_process
from ..facts.processes import read_all_processes
from ..target import Target, cgroup_target, pid_target

PID = re.compile(r"^[1-9][0-9]{0,9}$")
CONTAINER = re.compile(r"^(?:(?:containerd|cri-o|docker)://)?([0-9a-f]{12,64})$")
POD_UID = re.compile(r"^[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}$")
CGROUP_ID = re.compile(r"^/(?:[A-Za-z0-9_.:@=+-]+/)*[A-Za-z0-9_.:@=+-]*$")
MAX_DEPTH = 12


class BadLabel(ValueError):
    """A label value that fails validation (422)."""


class NotOnHost(LookupError):
    """A valid label naming nothing on this host (404)."""


class Ambiguous(BadLabel):
    """A valid label naming more than one thing on this host (422, listing them)."""


def _memory_root() -> tuple[int, Path] | None:
    mounts = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    v1 = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options), None)
    if v1 is not None:
        return 1, Path(v1.mount_point)
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    return (2, Path(v2.mount_point)) if v2 is not None else None


def cgroup_dirs() -> list[str]:
    """Every cgroup of the memory hierarchy, as paths inside it (/kubepods/pod.../abc)."""
    root = _memory_root()
    if root is None:
        return []
    base = root[1]
    out = []
    for dirpath, dirnames, _files in os.walk(base):
        depth = len(Path(dirpath).relative_to(base).parts)
        if depth >= MAX_DEPTH:
            dirnames[:] = []
        rel = "/" + Path(dirpath).relative_to(base).as_posix()
        out.append("/" if rel == "/." else rel)
    return out


def _largest_process(cg: CgroupLocation) -> int | None:
    try:
        pids = [int(p) for p in Path(cg.fs_path, "cgroup.procs").read_text().split()]
    except OSError:
        return None
    procs = read_all_processes(pids=pids)
    if not procs:
        return None
    return max(procs.values(), key=lambda p: p.rss or 0).pid


# How runtimes and the kubelet name a container's or a pod's own cgroup folder (the last path
# step): `<id>` (cgroupfs: /docker/<id>, /kubepods/<qos>/pod<uid>/<id>), `<runtime>-<id>.scope`
# (systemd: docker-, cri-containerd-, crio-, libpod-), `libpod-<id>` (podman, v1 /libpod_parent);
# a pod: `pod<uid>` or `kubepods-<qos>-pod<uid with _>.slice`. A step that merely contains the id
# (`x<id>`, `<id>-backup`) is not the container's.
_CONTAINER_STEP = re.compile(r"^(?:[A-Za-z0-9_.:]+(?:-[A-Za-z0-9_.:]+)*-)?([0-9a-f]{12,64})(?:\.scope)?$")
_POD_STEP = re.compile(r"^(?:[A-Za-z0-9_.:]+(?:-[A-Za-z0-9_.:]+)*-)?pod([0-9a-f_-]{36})(?:\.slice)?$")
MAX_LISTED = 5


def _cgroup_matching(step_matches, what: str) -> Target:
    """The one cgroup whose own folder names this container or pod. Folders inside a match are
    the same workload (children of the scope); two unrelated matches are ambiguous: anyone who may
    make a cgroup could otherwise take another container's alerts."""
    matches = sorted((d for d in cgroup_dirs() if d != "/" and step_matches(d.rsplit("/", 1)[-1])), key=len)
    if not matches:
        raise NotOnHost(f"no such {what} on this host")
    roots = [d for d in matches if not any(d.startswith(m + "/") for m in matches if m != d)]
    if len(roots) > 1:
        more = f" and {len(roots) - MAX_LISTED} more" if len(roots) > MAX_LISTED else ""
        listed = ", ".join(roots[:MAX_LISTED]) + more
        raise Ambiguous(f"{what} matches {len(roots)} cgroups: {listed}")
    return cgroup_target(roots[0])


def _container_step(cid: str):
    def matches(step: str) -> bool:
        m = _CONTAINER_STEP.match(step)
        return m is not None and "conmon" not in step and m.group(1).startswith(cid)

    return matches


def _pod_step(forms: set[str]):
    def matches(step: str) -> bool:
        m = _POD_STEP.match(step)
        return m is not None and m.group(1) in forms

    return matches


def _cgroup_path_ok(value: str) -> bool:
    """A cgroup named by its path in the hierarchy: allowed characters, no `.` or `..` steps."""
    absolute = value if value.startswith("/") else "/" + value
    return CGROUP_ID.fullmatch(absolute) is not None and not {".", ".."} & set(absolute.split("/"))


def cgroup_by_path(value: str) -> Target:
    """POST /diagnose's relative `cgroup`: the cgroup itself, validated by pattern, then resolved
    (symlinks too) and refused outside the mounted hierarchy by cgroup_target."""
    if not _cgroup_path_ok(value):
        raise BadLabel("cgroup: not a cgroup path (letters, digits, _.:@=+- and '/', no '.' or '..' steps)")
    return cgroup_target(value)


def target_from_labels(labels: dict[str, str]) -> Target:
    """pid, container_id, pod uid or cAdvisor id, in that order. Within a cgroup the process
    diagnosed is the largest by RSS, unless a pid was named."""
    if "pid" in labels:
        value = labels["pid"]
        if not PID.fullmatch(value):
            raise BadLabel("label pid: not a process id")
        try:
            read_process(int(value))
        except ProcessGone:
            raise NotOnHost(f"label pid: no process {int(value)} on this host") from None
        return pid_target(int(value))
    if "container_id" in labels:
        m = CONTAINER.fullmatch(labels["container_id"])
        if not m:
            raise BadLabel("label container_id: expected containerd://, cri-o:// or docker:// and a hex id")
        cid = m.group(1)
        target = _cgroup_matching(_container_step(cid), "container")
    elif "uid" in labels or "pod_uid" in labels:
        uid = labels["uid"] if "uid" in labels else labels["pod_uid"]
        if not POD_UID.fullmatch(uid):
            raise BadLabel("label uid: not a pod uid")
        forms = {uid.replace("_", "-"), uid.replace("-", "_")}
        target = _cgroup_matching(_pod_step(forms), "pod")
    elif "id" in labels:
        value = labels["id"]
        if not value.startswith("/") or not _cgroup_path_ok(value):
            raise BadLabel("label id: not a cgroup path")
        known = set(cgroup_dirs())
        if value.rstrip("/") not in known and value not in known:
            raise NotOnHost("label id: no such cgroup on this host")
        target = cgroup_target(value)
    else:
        raise BadLabel("no label names a target: give pid, container_id, uid or id")
    pid = _largest_process(target.cgroup) if target.cgroup else None
    return pid_target(pid) if pid is not None else target
