"""The always-on OOM watch: the oomkill probe polled for as long as the server runs; each kill
becomes an incident with victim, trigger, cgroup, limit and host memory at that moment, and the
cgroup is diagnosed if anything in it still runs.

What a kill becomes is decided here (KillIncidents): an incident keyed by the kill, and a diagnosis
of what survives in the cgroup whose limit was hit.

A kill inside a container is attributed to it (and to its Kubernetes pod) from the victim's
cgroup path, and its incident is named and keyed by the container. The container is often gone
when its kill is recorded (its main process was the victim; `podman run --rm` removes it at
once): what its runtime said of it is taken while it runs (KnownContainers), and the runtime is
asked again at the kill for containers it did not see (an exited container is still listed)."""

from __future__ import annotations

import collections
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from memdiag.probes.oomkill import OomEvent, OomWatch
from memdiag.system.cgroup import cgroup_pids, memory_hierarchy
from memdiag.system.container import list_containers, parse_container_path, parse_pod_path
from memdiag.system.processes import read_all_processes
from memdiag.system.units import fmt_bytes

from ..containers import ContainerInfo, container_of_cgroup
from ..errors import UsageError
from ..target import Target, pid_target, with_container
from .cases import service_key
from .recorder import Recorder
from .scene import Scene
from .store import Store
from .targets import NotOnHost, target_from_labels
from .worker import QueueFull, Worker

# A supervisor restarts a killed service within this (systemd's RestartSec defaults to 100 ms, podman's
# restart policy and a shell loop at once; Kubernetes backs off 10 s and more: it is diagnosed as its
# cgroup's largest process then): the follow-up of a service that was seen growing waits for it.
RESTART_GRACE_S = 5.0
FORGET_AFTER_S = 600.0  # a container gone from the cgroup tree this long is no longer remembered
MAX_KNOWN = 4096
LOOKUPS_PER_POLL = 4
NAMELESS_RETRY_S = 1.0  # a container the runtime did not name is asked again after this
NAMELESS_TRIES = 10


def describe(e: OomEvent, container: ContainerInfo | None = None) -> str:
    scope = "cgroup limit" if e.cgroup_oom else "system out of memory"
    limit = f" (limit {fmt_bytes(e.limit)})" if e.limit else ""
    outside = f" ({e.outside_namespace})" if e.outside_namespace else ""
    where = e.memcg or e.victim_cgroup or "unknown cgroup"
    return (
        f"OOM killer killed {e.victim()}{_in(container, e)}, anon RSS {fmt_bytes(e.anon_rss)}: {scope}"
        f" in {where}{limit}; triggered by {e.trigger()}"
        f"; host MemAvailable {fmt_bytes(e.mem_available)}{outside}"
    )


def _in(c: ContainerInfo | None, e: OomEvent) -> str:
    if c is None:
        pod = _pod_of(e)
        return f" in pod {pod[0]}" if pod else ""
    pod = f"{c.namespace}/{c.pod}" if c.pod and c.namespace else c.pod or c.pod_uid
    return f" in {c.describe()}" + (f" of pod {pod}" if pod else "")


def incident_place(e: OomEvent, container: ContainerInfo | None) -> dict | None:
    """Where the kill happened, as the incident's target: the container (and pod) when there is
    one, else the Kubernetes pod whose cgroup it was in (a pod-level limit), else the cgroup."""
    cgroup = e.memcg or e.victim_cgroup
    if container is not None:
        return {"kind": "container", "cgroup": cgroup, "container": container.model_dump()}
    pod = _pod_of(e)
    if pod is not None:
        return {"kind": "pod", "cgroup": cgroup, "pod_uid": pod[0], "qos": pod[1]}
    return {"kind": "cgroup", "cgroup": cgroup} if cgroup else None


def incident_key(e: OomEvent, container: ContainerInfo | None) -> str:
    """One kill, under its container (else pod) when it has one: a kill recorded twice (a retried
    write) is one incident, and a container's kills share the prefix oom:<runtime>:<id>:."""
    pod = _pod_of(e)
    if container is not None:
        place = f"{container.runtime}:{container.id}"
    elif pod is not None:
        place = f"pod:{pod[0]}"
    else:
        place = f"cgroup:{e.memcg or e.victim_cgroup or '?'}"
    return f"oom:{place}:{e.victim_host_pid}:{e.when:.6f}"


def _pod_of(e: OomEvent) -> tuple[str, str | None] | None:
    """(uid, qos) of the Kubernetes pod the victim's (else the limited) cgroup is in."""
    return next((p for cg in (e.victim_cgroup, e.memcg) if cg and (p := parse_pod_path(cg))), None)


class KnownContainers:
    """The containers of this host as their runtime described them while they ran, by id: the
    cgroup tree is read each poll (a walk of the memory hierarchy's folders), the runtime's CLI
    only for a container not seen before, or seen without a name (asked again a few times)."""

    def __init__(self) -> None:
        found = memory_hierarchy()
        self.mount = Path(found[1].mount_point) if found else None
        self.known: dict[str, ContainerInfo] = {}
        self.seen: dict[str, float] = {}  # id -> when last in the cgroup tree
        self.asked: dict[str, tuple[float, int]] = {}  # id -> when the runtime was last asked, how often

    def refresh(self) -> None:
        if self.mount is None:
            return
        now, asked = time.monotonic(), 0
        for c in list_containers(self.mount):
            self.seen[c.id] = now
            # a few runtime look-ups a poll (each may run its CLI): many new containers at once do
            # not hold up the kills behind them
            if asked < LOOKUPS_PER_POLL and self._ask(c.id, now):
                asked += 1
                info = _lookup(c.path)
                if info is not None:
                    self.known[c.id] = info
        for cid in [cid for cid, t in self.seen.items() if now - t > FORGET_AFTER_S]:
            self.seen.pop(cid)
            self.known.pop(cid, None)
            self.asked.pop(cid, None)

    def _ask(self, cid: str, now: float) -> bool:
        """Whether to ask the runtime about this container now: not known yet, or known without a
        name and not asked for a while (a runtime's listing taken just before the container was
        made does not name it; a host without a runtime CLI never will)."""
        info, (last, times) = self.known.get(cid), self.asked.get(cid, (0.0, 0))
        if info is not None and (info.name is not None or times >= NAMELESS_TRIES or now - last < NAMELESS_RETRY_S):
            return False
        if info is None and len(self.known) >= MAX_KNOWN:
            return False
        self.asked[cid] = (now, times + 1)
        return True

    def of(self, e: OomEvent) -> ContainerInfo | None:
        """The container of a kill's victim (else of the cgroup whose limit was hit): what the
        runtime says now, completed with what it said while the container ran."""
        for cgroup in (e.victim_cgroup, e.memcg):
            found = parse_container_path(cgroup) if cgroup else None
            if found is None:
                continue
            # _lookup asks the runtime again when its cached listing predates this container
            # (diagnose/containers.py _listing): no wait here, the kills behind this one are not held up
            return _merged(_lookup(cgroup), self.known.get(found.id))  # type: ignore[arg-type]
        return None


def _merged(now: ContainerInfo | None, before: ContainerInfo | None) -> ContainerInfo | None:
    """What the runtime says now, completed with what it said before (a removed container's name)."""
    if now is None or before is None:
        return now or before
    return now.model_copy(update={k: v for k, v in before.model_dump().items() if getattr(now, k) is None})


def _lookup(cgroup: str) -> ContainerInfo | None:
    try:
        return container_of_cgroup(cgroup)
    except (UsageError, OSError, ValueError):  # no memory hierarchy, a vanished folder: no name
        return None


def attribute(e: OomEvent, known: KnownContainers) -> tuple[OomEvent, ContainerInfo | None]:
    """The kill and its container; the container's limit as seen while it ran stands in for a
    limit that could not be read at the kill (its cgroup removed)."""
    container = known.of(e)
    if container is not None and e.limit is None and container.limit_bytes is not None:
        e = e.model_copy(update={"limit": container.limit_bytes})
    return e, container


def _attributed(e: OomEvent, known: KnownContainers) -> tuple[OomEvent, ContainerInfo | None]:
    """attribute(), and a kill recorded without its container rather than a watch that ends."""
    try:
        return attribute(e, known)
    except Exception as err:  # noqa: BLE001
        print(f"memdiag serve: the container of an OOM kill not found: {err}", file=sys.stderr, flush=True)
        return e, None


def survivor(e: OomEvent, container: ContainerInfo | None) -> Target | None:
    """What to diagnose after a kill: the victim's program restarted in the cgroup whose limit was
    hit (a process of the victim's name), else the largest process left there (else in the victim's
    cgroup), or None: a system OOM in the root cgroup (recorded, not diagnosed), a cgroup gone,
    or only the victim left (it may linger in cgroup.procs while it dies). A survivor in the victim's
    own container is described with what was known of the container at the kill; one in another
    container of the pod (or in none) keeps its own."""
    cgroup = e.memcg or e.victim_cgroup
    if not cgroup or cgroup == "/":
        return None
    try:
        target = _restarted(cgroup, e) or target_from_labels({"id": cgroup})
    except (NotOnHost, ValueError, UsageError):
        return None  # the cgroup is gone
    if target.kind != "pid" or target.pid == e.victim_pid:
        return None
    if container is not None and target.container is not None and target.container.id == container.id:
        return target.model_copy(update={"container": container})  # the report in its terms
    return target


def _restarted(cgroup: str, e: OomEvent) -> Target | None:
    """A process of the victim's name in the cgroup, not the victim: its program, restarted."""
    found = memory_hierarchy()
    if found is None or not e.victim_comm:
        return None
    folder = Path(found[1].mount_point) / cgroup.lstrip("/")
    procs = read_all_processes(pids=cgroup_pids(folder)) if folder.is_dir() else {}
    same = [p for pid, p in procs.items() if p.comm == e.victim_comm and pid != e.victim_pid and p.state != "Z"]
    if not same:
        return None
    return with_container(pid_target(max(same, key=lambda p: p.rss or 0).pid))


def kill_service(e: OomEvent, container: ContainerInfo | None) -> str | None:
    """The service a kill struck (serve/cases.py): the victim's program in its cgroup, or its container."""
    cgroup = e.victim_cgroup or e.memcg
    return service_key(
        {
            "kind": "pid",
            "comm": e.victim_comm,
            "cgroup": cgroup,
            "container": container.model_dump() if container else None,
        }
    )


class KillIncidents:
    """The watch's on_kill: each kill an incident under its own key (a kill delivered twice, after a
    refused write, is one incident, counted once), queued for a diagnosis of its survivor when there
    is one, else recorded; with the queue full it stays recorded, with the reason. A refused write
    raises StorageFailing: the watch keeps the kill and delivers it again later."""

    def __init__(
        self,
        store: Store,
        worker: Worker,
        counted: Callable[[], None] = lambda: None,
        grace_s: float = RESTART_GRACE_S,
        recorder: Recorder | None = None,
    ):
        self.store, self.worker, self.counted, self.grace_s = store, worker, counted, grace_s
        self.recorder = recorder

    def __call__(self, e: OomEvent, container: ContainerInfo | None) -> None:
        service = kill_service(e, container)
        scene = self._scene(e)
        # a service diagnosed growing before, or seen growing by the recorder: its restart is waited
        # for, then followed (the worker compares what runs now with that diagnosis, or with the
        # recorder's scene: does the restarted process grow the same way?)
        follow = self.store.latest_growth(service, e.when) is not None or (scene is not None and scene.grew)
        target = None if follow else survivor(e, container)
        record = {**e.model_dump(), "container": container.model_dump() if container else None}
        summary = describe(e, container)
        if scene is not None:
            record["scene"] = scene.model_dump()
            summary += "; " + scene.text
        state = "queued" if target is not None or follow else "recorded"
        where, key = incident_place(e, container), incident_key(e, container)
        incident, new = self.store.record("oomwatch", state, where, record, key, summary=summary)
        if not new:
            return
        self.counted()
        if follow:
            timer = threading.Timer(self.grace_s, self._after_restart, (incident.id, e, container))
            timer.daemon = True
            timer.start()
        elif target is not None:
            self._submit(incident.id, target)

    def _scene(self, e: OomEvent) -> Scene | None:
        """What the recorder saw grow in the cgroup whose limit was hit (else the victim's) before the kill."""
        if self.recorder is None:
            return None
        try:
            if e.cgroup_oom is True:  # the cgroup whose limit was hit
                return self.recorder.scene(e.memcg, e.victim_pid, e.victim_comm, e.when, e.limit, e.victim())
            # the host ran out (or the log did not say): the victim's cgroup, its limit not the cause
            cgroup = e.victim_cgroup or e.memcg
            return self.recorder.scene(cgroup, e.victim_pid, e.victim_comm, e.when, None, e.victim(), host_oom=True)
        except Exception as err:  # noqa: BLE001 (the kill is recorded without its scene rather than lost)
            print(f"memdiag serve: the recorder's scene of a kill not read: {err}", file=sys.stderr, flush=True)
            return None

    def _after_restart(self, iid: str, e: OomEvent, container: ContainerInfo | None) -> None:
        target = survivor(e, container)
        if target is None:
            self.store.settle(iid, state="recorded", error="nothing ran in its cgroup after the restart grace")
            return
        self._submit(iid, target)

    def _submit(self, iid: str, target: Target) -> None:
        try:
            self.worker.submit(iid, target)
        except QueueFull:
            self.store.settle(iid, state="recorded", error="queue full: recorded, not diagnosed")


class OomWatcher:
    def __init__(self, on_kill: Callable[[OomEvent, ContainerInfo | None], None]):
        self.on_kill = on_kill
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: str | None = None
        # kills whose record failed (storage refusing): retried each poll; bounded, oldest dropped
        self.backlog: collections.deque[tuple[OomEvent, ContainerInfo | None]] = collections.deque(maxlen=1000)
        self.thread = threading.Thread(target=self._loop, name="memdiag-oomwatch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            watch = OomWatch()
            known = KnownContainers()
        except Exception as e:  # unavailable kernel features: the server runs on without the watch
            self.error = str(e)
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self.stop.is_set():
                self._refresh(known)
                # attributed once, on arrival: the container may be gone by a retry
                self.backlog.extend(_attributed(e, known) for e in watch.poll(250))
                self._deliver()
        finally:
            watch.close()

    @staticmethod
    def _refresh(known: KnownContainers) -> None:
        try:
            known.refresh()
        except Exception as e:  # noqa: BLE001 (a folder removed mid-walk, a runtime's odd answer: the watch goes on)
            print(f"memdiag serve: containers not read: {e}", file=sys.stderr, flush=True)

    def _deliver(self) -> None:
        for _ in range(len(self.backlog)):
            event, container = self.backlog.popleft()
            try:
                self.on_kill(event, container)
            except Exception as e:  # noqa: BLE001 (kept and retried: the watch never ends)
                self.backlog.append((event, container))
                pid = event.victim_pid or event.victim_host_pid
                print(
                    f"memdiag serve: OOM kill of PID {pid} not recorded yet: {e}",
                    file=sys.stderr,
                    flush=True,
                )
                break
