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


def _cgroup_matching(predicate) -> Target:
    matches = [d for d in cgroup_dirs() if predicate(d)]
    if not matches:
        raise NotOnHost("no such container or pod on this host")
    matches.sort(key=len)  # the scope itself, not its children
    return cgroup_target(matches[0])


def _cgroup_path_ok(value: str) -> bool:
    """A cgroup named by its path in the hierarchy: allowed characters, no `.` or `..` steps."""
    absolute = value if value.startswith("/") else "/" + value
    return CGROUP_ID.match(absolute) is not None and not {".", ".."} & set(absolute.split("/"))


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
        if not PID.match(value):
            raise BadLabel("label pid: not a process id")
        try:
            read_process(int(value))
        except ProcessGone:
            raise NotOnHost(f"label pid: no process {int(value)} on this host") from None
        return pid_target(int(value))
    if "container_id" in labels:
        m = CONTAINER.match(labels["container_id"])
        if not m:
            raise BadLabel("label container_id: expected containerd://, cri-o:// or docker:// and a hex id")
        cid = m.group(1)
        target = _cgroup_matching(lambda d: any(cid in part for part in d.split("/")))
    elif "uid" in labels or "pod_uid" in labels:
        uid = labels.get("uid") or labels["pod_uid"]
        if not POD_UID.match(uid):
            raise BadLabel("label uid: not a pod uid")
        forms = {uid.replace("_", "-"), uid.replace("-", "_")}
        target = _cgroup_matching(lambda d: any(f"pod{f}" in part for f in forms for part in d.split("/")))
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
