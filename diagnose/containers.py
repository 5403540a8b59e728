"""A container or a Kubernetes pod named by a user or an alert, resolved to its memory cgroup on this
host: what the cgroup tree shows (facts/container.py: the runtimes' folder names, hence full ids),
completed with names, images and pods from the runtime's own CLI when one is installed (podman,
docker, crictl), asked for its whole list with a short timeout and never through a shell. A
reference is compared with what the list holds; it is never passed to the CLI.

Short ids: any unique prefix of at least MIN_PREFIX hex digits, as `podman`/`docker` accept any
unique prefix. Four, not one: below four digits a prefix picks among so few values that on a host
of a few hundred containers it is usually ambiguous anyway, and it is too easily a typo or a name."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from memdiag.system._parse import Model, read_text
from memdiag.system.cgroup import cgroup_pids, limit_bytes, memory_hierarchy, own_limit
from memdiag.system.container import (
    CONTAINER_REF,
    ID_SCHEME,
    POD_UID,
    ContainerCgroup,
    ContainerInfo,
    PodInfo,
    Runtime,
    list_containers,
    list_pods,
    parse_container_path,
)
from memdiag.system.process import innermost_pid
from pydantic import ConfigDict, ValidationError

from .errors import AmbiguousTarget, UnknownTarget, UsageError

MIN_PREFIX = 4
MAX_LISTED = 5
CLI_TIMEOUT_S = 5.0
CLIS = ("podman", "docker", "crictl")
# A reference: a runtime's id (hex, with an optional `docker://`-style scheme as in Kubernetes'
# containerStatuses) or a name (Docker's and podman's rule: [a-zA-Z0-9][a-zA-Z0-9_.-]*; Kubernetes
# names are a subset).
_HEX = re.compile(r"^[0-9a-f]+$")


class _Listed(Model):
    """One container as a runtime's CLI lists it."""

    model_config = ConfigDict(frozen=True)

    id: str
    names: tuple[str, ...] = ()
    image: str | None = None
    runtime: Runtime
    pid: int | None = None
    pod_uid: str | None = None
    pod: str | None = None
    namespace: str | None = None


class _Pod(Model):
    model_config = ConfigDict(frozen=True)

    uid: str
    name: str
    namespace: str | None = None


# --- the runtimes' CLIs --------------------------------------------------------------------------


def _run_json(argv: list[str]):
    """The CLI's JSON output; None when it is missing, fails (a docker client without a daemon),
    times out or writes something else (not UTF-8, nested past the parser's depth). A CLI that timed
    out is not asked again for FAILED_BACKOFF_S: a hung runtime must not hold up the OOM watch."""
    exe = argv[0]
    if time.monotonic() < _FAILED_UNTIL.get(exe, 0.0):
        return None
    try:
        done = subprocess.run(argv, capture_output=True, timeout=CLI_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        _FAILED_UNTIL[exe] = time.monotonic() + FAILED_BACKOFF_S
        return None
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    text = done.stdout.decode("utf-8", errors="replace")
    try:
        return json.loads(text or "null")
    except (ValueError, RecursionError):
        # docker's `--format '{{json .}}'` writes one object a line
        try:
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        except (ValueError, RecursionError):
            return None


_FAILED_UNTIL: dict[str, float] = {}
FAILED_BACKOFF_S = 30.0


def _rows(data, key: str | None = None) -> list[dict]:
    """The objects of a CLI's JSON list (or of data[key]); anything else is no row."""
    if key is not None:
        data = data.get(key) if isinstance(data, dict) else None
    return [r for r in data if isinstance(r, dict)] if isinstance(data, list) else []


def _kept(make, rows: list[dict]) -> list:
    """make(row) for each row, leaving out a row of a shape this version does not know."""
    out = []
    for r in rows:
        try:
            out.append(make(r))
        except (ValidationError, AttributeError, KeyError, TypeError):
            continue
    return out


def _k8s(labels: dict) -> dict:
    """The pod of a container, from the labels the kubelet puts on it."""
    return {
        "pod_uid": labels.get("io.kubernetes.pod.uid"),
        "pod": labels.get("io.kubernetes.pod.name"),
        "namespace": labels.get("io.kubernetes.pod.namespace"),
    }


def _names(value) -> tuple[str, ...]:
    """Podman's Names: a list (podman 2+) or one string (1.x); anything else names nothing."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str))
    return ()


def parse_podman_ps(data) -> list[_Listed]:
    """`podman ps --all --format json`: a list of {Id, Names, Image, Pid, PodName, Labels}."""

    def make(r: dict) -> _Listed:
        pod = _k8s(r.get("Labels") or {})
        pod["pod"] = r.get("PodName") or pod["pod"]  # a podman pod (`podman pod create`)
        return _Listed(
            id=r["Id"],
            names=_names(r.get("Names")),
            image=r.get("Image") or None,
            runtime="podman",
            pid=r.get("Pid") or None,
            **pod,
        )

    return _kept(make, _rows(data))


def parse_docker_inspect(data) -> list[_Listed]:
    """`docker inspect`: a list of {Id, Name: "/name", State: {Pid}, Config: {Image, Labels}}."""

    def make(r: dict) -> _Listed:
        config = r.get("Config") or {}
        return _Listed(
            id=r["Id"],
            names=(str(r.get("Name") or "").lstrip("/"),),
            image=config.get("Image") or None,
            runtime="docker",
            pid=(r.get("State") or {}).get("Pid") or None,
            **_k8s(config.get("Labels") or {}),
        )

    return _kept(make, _rows(data))


def parse_crictl_ps(data) -> list[_Listed]:
    """`crictl ps --all -o json`: {containers: [{id, metadata: {name}, image: {image}, imageRef, labels}]}."""

    def make(r: dict) -> _Listed:
        image = (r.get("image") or {}).get("image") or None
        if image is None or image.startswith("sha256:"):  # an image id: the reference names it better
            image = r.get("imageRef") or image
        return _Listed(
            id=r["id"],
            names=((r.get("metadata") or {}).get("name") or "",),
            image=image,
            runtime="unknown",  # crictl speaks for containerd or CRI-O alike: the cgroup path says which
            **_k8s(r.get("labels") or {}),
        )

    return _kept(make, _rows(data, "containers"))


def parse_crictl_pods(data) -> list[_Pod]:
    """`crictl pods -o json`: {items: [{id, metadata: {name, uid, namespace}}]}."""

    def make(r: dict) -> _Pod:
        meta = r.get("metadata") or {}
        return _Pod(uid=meta["uid"], name=meta["name"], namespace=meta.get("namespace"))

    return _kept(make, _rows(data, "items"))


def _podman(exe: str) -> list[_Listed]:
    return parse_podman_ps(_run_json([exe, "ps", "--all", "--format", "json"]))


def _docker(exe: str) -> list[_Listed]:
    rows = _rows(_run_json([exe, "ps", "--all", "--no-trunc", "--format", "{{json .}}"]))
    ids = [r["ID"] for r in rows if isinstance(r.get("ID"), str) and _HEX.fullmatch(r["ID"])]
    return parse_docker_inspect(_run_json([exe, "inspect", "--type", "container", "--", *ids])) if ids else []


def _crictl(exe: str) -> list[_Listed]:
    return parse_crictl_ps(_run_json([exe, "ps", "--all", "-o", "json"]))


_LISTERS = {"podman": _podman, "docker": _docker, "crictl": _crictl}


def installed_clis() -> tuple[str, ...]:
    """The runtime CLIs on PATH."""
    return tuple(name for name in CLIS if shutil.which(name))


def _listing(clis: tuple[str, ...], need: Iterable[str] = ()) -> dict[str, _Listed]:
    """The containers the CLIs list, by id; one listing serves for CACHE_S (an alert group names
    many containers at once: one CLI call, not one per alert), unless it lacks an id in `need` that
    was first wanted after it was taken (a container started since): then the CLIs are asked again,
    once — an id the runtime does not know (another runtime's container) costs no more calls."""
    now = time.monotonic()
    cached = _CACHE.get(clis)
    if len(_WANTED) > MAX_WANTED:
        _WANTED.clear()
    wanted = {i: _WANTED.setdefault(i, now) for i in need}
    fresh = cached is not None and now - cached[0] < CACHE_S
    if fresh and all(i in cached[1] or t <= cached[0] for i, t in wanted.items()):
        return cached[1]
    out: dict[str, _Listed] = {}
    for name in clis:
        exe = shutil.which(name)
        if exe is not None:
            out.update((entry.id, entry) for entry in _LISTERS[name](exe) if entry.id)
    _CACHE[clis] = (time.monotonic(), out)
    return out


_WANTED: dict[str, float] = {}  # id -> when first wanted
MAX_WANTED = 4096


_CACHE: dict[tuple[str, ...], tuple[float, dict[str, _Listed]]] = {}
CACHE_S = 2.0


def _crictl_pods() -> list[_Pod]:
    exe = shutil.which("crictl")
    return parse_crictl_pods(_run_json([exe, "pods", "-o", "json"])) if exe else []


# --- the cgroup tree -------------------------------------------------------------------------------


def _hierarchy(mount: Path | None) -> Path:
    if mount is not None:
        return mount
    found = memory_hierarchy()
    if found is None:
        raise UsageError("no memory cgroup hierarchy is mounted on this host: containers cannot be found")
    return Path(found[1].mount_point)


def _main_pid(folder: Path, proc_root: Path) -> int | None:
    """The container's first process: the one that is pid 1 in its own namespace (NSpid's last
    field), else the lowest pid in the container's cgroup."""
    pids = sorted(cgroup_pids(folder))
    for pid in pids:
        if pid != 1 and innermost_pid(read_text(proc_root / str(pid) / "status") or "") == 1:
            return pid
    return pids[0] if pids else None


def _info(found: ContainerCgroup, listed: _Listed | None, mount: Path, proc_root: Path) -> ContainerInfo:
    folder = mount / found.path.lstrip("/")
    runtime = found.runtime if found.runtime != "unknown" or listed is None else listed.runtime
    return ContainerInfo(
        id=found.id,
        name=listed.names[0] if listed and listed.names and listed.names[0] else None,
        image=listed.image if listed else None,
        runtime=runtime,
        cgroup=found.path,
        pod_uid=found.pod_uid or (listed.pod_uid if listed else None),
        pod=listed.pod if listed else None,
        namespace=listed.namespace if listed else None,
        host_pid=(listed.pid if listed and listed.pid else None) or _main_pid(folder, proc_root),
        limit_bytes=own_limit(folder),  # its scope's, or its leaf's (crun on v2)
    )


def _one_line(items: list[str]) -> str:
    more = f" and {len(items) - MAX_LISTED} more" if len(items) > MAX_LISTED else ""
    return ", ".join(items[:MAX_LISTED]) + more


def _label(c: ContainerCgroup, listed: dict[str, _Listed], full: bool = False) -> str:
    entry = listed.get(c.id)
    name = entry.names[0] if entry and entry.names else None
    shown = c.id if full else c.id[:12]
    return f"{shown} ({name})" if name else shown


def resolve_container(
    ref: str,
    *,
    mount: Path | None = None,
    clis: Sequence[str] | None = None,
    proc_root: Path = Path("/proc"),
    min_prefix: int = MIN_PREFIX,
    said: str = "--container",
    by_name: bool = True,
    list_running: bool = True,
) -> ContainerInfo:
    """A running container by full id, name (through a runtime CLI) or unique id prefix (at least
    min_prefix hex digits): in that order, as the runtimes look a reference up themselves.
    mount: the memory hierarchy folder (default this host's); clis: the CLIs to ask (default the
    installed ones); said: what the messages call the reference; by_name: whether ref may be a name
    (not a label that holds an id: a miss then costs no CLI call); list_running: whether an unknown
    one's message lists the running containers (a user's help, not a webhook sender's).
    Raises UnknownTarget / AmbiguousTarget (usage errors) or UsageError, each one line."""
    given = ref
    ref = ID_SCHEME.sub("", ref.strip())
    if not CONTAINER_REF.fullmatch(ref):
        raise UsageError(f"{said} {given!r}: not a container id or name (letters, digits, '_', '.', '-')")
    base = _hierarchy(mount)
    running = list_containers(base)
    clis = installed_clis() if clis is None else tuple(clis)
    chosen = [c for c in running if c.id == ref]
    listed: dict[str, _Listed] = {}
    if not chosen and by_name:
        listed = _listing(clis, need=[c.id for c in running])
        named = {i for i, entry in listed.items() if ref in entry.names}
        chosen = [c for c in running if c.id in named]
        if named and not chosen:
            raise UnknownTarget(f"{said} {ref}: the container is not running (no cgroup on this host)")
    if not chosen and _HEX.fullmatch(ref):
        if len(ref) < min_prefix:
            raise UsageError(f"{said} {ref}: an id prefix needs at least {min_prefix} hex digits")
        chosen = [c for c in running if c.id.startswith(ref)]
    if not chosen:
        hint = "" if clis or not by_name else "; names need podman, docker or crictl, none is installed: give the id"
        there = _one_line([_label(c, listed) for c in running]) or "none"
        running_now = f" (running: {there})" if list_running else ""
        raise UnknownTarget(f"{said} {ref}: no such running container{hint}{running_now}")
    listed = listed or _listing(clis, need=[c.id for c in chosen])
    if len(chosen) > 1:
        shown = [_label(c, listed) for c in chosen]
        if len(set(shown)) < len(shown):  # short ids alike: the full ones tell them apart
            shown = [_label(c, listed, full=True) for c in chosen]
        if len(set(shown)) < len(shown):  # one id in two cgroups: only the paths do
            shown = [c.path for c in chosen]
        raise AmbiguousTarget(f"{said} {ref}: ambiguous, matches {len(chosen)} containers: {_one_line(shown)}")
    return _info(chosen[0], listed.get(chosen[0].id), base, proc_root)


def container_of_cgroup(
    path: str,
    *,
    mount: Path | None = None,
    clis: Sequence[str] | None = None,
    proc_root: Path = Path("/proc"),
) -> ContainerInfo | None:
    """The container a cgroup path (a process's, an OOM kill's) is or is inside; None: no container."""
    found = parse_container_path(path)
    if found is None:
        return None
    listed = _listing(installed_clis() if clis is None else tuple(clis), need=[found.id])
    return _info(found, listed.get(found.id), _hierarchy(mount), proc_root)


def resolve_pod(
    namespace: str | None,
    pod: str | None,
    uid: str | None,
    *,
    mount: Path | None = None,
    clis: Sequence[str] | None = None,
    proc_root: Path = Path("/proc"),
) -> PodInfo:
    """A Kubernetes pod by uid, or by namespace and name (which needs crictl: the cgroup tree
    knows pods by uid only). Raises UnknownTarget / AmbiguousTarget / UsageError with one line."""
    clis = installed_clis() if clis is None else tuple(clis)
    names: dict[str, _Pod] = {p.uid: p for p in _crictl_pods()} if "crictl" in clis else {}
    if uid is None:
        if pod is None:
            raise UsageError("pod: give a pod uid, or its namespace and name")
        if "crictl" not in clis:
            raise UsageError(f"pod {pod}: pod names need crictl, which is not installed here: give the pod's uid")
        uids = [p.uid for p in names.values() if p.name == pod and namespace in (None, p.namespace)]
        if len(uids) > 1:
            listed = [f"{names[u].namespace}/{pod} ({u})" for u in uids]
            raise AmbiguousTarget(f"pod {pod}: in {len(uids)} namespaces, give the namespace: {_one_line(listed)}")
        if not uids:
            raise UnknownTarget(f"pod {namespace + '/' if namespace else ''}{pod}: no such pod on this host")
        uid = uids[0]
    uid = uid.replace("_", "-")
    if not POD_UID.fullmatch(uid):
        raise UsageError(f"pod uid {uid!r}: not a pod uid")
    base = _hierarchy(mount)
    found = [p for p in list_pods(base) if p.uid == uid]
    if not found:
        raise UnknownTarget(f"pod {uid}: no cgroup of this pod on this host")
    if len(found) > 1:
        raise AmbiguousTarget(f"pod {uid}: matches {len(found)} cgroups: {_one_line([p.path for p in found])}")
    listed = _listing(clis)
    members = [
        _info(c, listed.get(c.id), base, proc_root)
        for c in list_containers(base)
        if c.path.startswith(found[0].path + "/")
    ]
    known = names.get(uid)
    return PodInfo(
        uid=uid,
        name=known.name if known else next((c.pod for c in members if c.pod), None),
        namespace=known.namespace if known else next((c.namespace for c in members if c.namespace), None),
        qos=found[0].qos,
        cgroup=found[0].path,
        limit_bytes=limit_bytes(base / found[0].path.lstrip("/")),
        containers=members,
    )
