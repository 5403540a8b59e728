"""One diagnosis at a time (the overhead budget is per host), from a bounded queue. The worker
never dies: every failure ends its incident as failed with the reason, and the loop goes on. Each
diagnosis runs in a process of its own (child.py), killed at its deadline: a target that makes a
diagnosis hang costs that incident, and the next one is diagnosed."""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from memdiag.system import identity

from ..errors import UsageError
from ..render import render_all
from ..report import Report
from ..target import Target, cgroup_target, pid_target, system_target, with_container
from ..verify import baseline_facts, compare_scene
from .cases import follow_up, report_service, service_key, worth_following
from .child import DEFAULT_RUNNER, ERROR, REPORT, Request
from .scene import NO_GROWTH, Scene
from .store import Incident, ReportGone, StorageFailing, Store
from .targets import BadLabel, NotOnHost, target_from_labels

# "Stuck": running past the deadline the worker kills at, and the reaping after it, by this much:
# before, 3x the window plus 2 minutes, which a window of 10 s or less reaches before the kill and
# reap of a diagnosis blocked in the kernel are done (healthz said stuck while the worker was not)
STUCK_MARGIN_S = 30.0
# A diagnosis's deadline: twice its window plus two minutes (the BPF compile of a cold cache, the
# pricing, a scan and the report come on top of the window), below the point where /healthz calls
# the worker stuck, so a hung diagnosis is killed before the node is reported unhealthy.
DEADLINE_FACTOR, DEADLINE_SLACK = 2, 120.0
REAP_S = 10.0  # for a killed diagnosis's process to be reaped (SIGKILL: at once, unless the host is stalled)


def _reaped(proc: subprocess.Popen) -> bool:
    """Wait REAP_S for a killed diagnosis's process; True once reaped. A process blocked where
    SIGKILL cannot reach it (a lookup waiting on a lock that a target's FUSE server holds: its own
    thread waits on the server, in that folder) is left to a thread that reaps it whenever the
    kernel lets it go: the worker goes on to the next incident (it waited on it forever before)."""
    try:
        proc.communicate(timeout=REAP_S)
        return True
    except (subprocess.TimeoutExpired, OSError, ValueError):
        pass
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return False


def default_deadline(window: float) -> float:
    return DEADLINE_FACTOR * window + DEADLINE_SLACK


class DiagnosisFailed(Exception):
    """The diagnosis's process ended without a report (its message is the incident's error as it is)."""


class DiagnosisKilled(DiagnosisFailed):
    """The diagnosis ran past its deadline and was killed."""


class QueueFull(Exception):
    pass


@dataclass
class Job:
    source: str
    target: Target
    target_json: dict | None
    alert: dict | None
    dedup_key: str | None
    duration: float | None = None


class Worker:
    def __init__(
        self,
        store: Store,
        duration: float,
        budget: float,
        rules,
        maxsize: int = 16,
        on_done: Callable[[float, object], None] | None = None,
        deadline: Callable[[float], float] = default_deadline,
        runner: str = DEFAULT_RUNNER,
        notifier=None,
    ):
        self.store, self.duration, self.budget, self.rules = store, duration, budget, rules
        self.deadline, self.runner = deadline, runner  # the seconds a window's diagnosis may take; what it calls
        self.maxsize = maxsize
        self._queue: collections.deque[tuple[str, Target | None, float | None]] = collections.deque()
        self._ready = threading.Condition()
        self.admission = threading.Lock()  # capacity check and queueing of one group, together
        self.on_done = on_done
        # notify.Notifier when serve pushes verdicts out: told of each done incident, it delivers on
        # a thread of its own, so a slow or failing destination never holds the next diagnosis
        self.notifier = notifier
        self.current: tuple[str, float, float] | None = None  # (incident, monotonic start, window)
        for incident in store.resumed:  # cut off by a restart: their targets are looked up again
            self._queue.append((incident.id, None, None))
        self.thread = threading.Thread(target=self._loop, name="memdiag-worker", daemon=True)
        self.thread.start()

    def qsize(self) -> int:
        return len(self._queue)

    def submit(self, iid: str, target: Target | None, duration: float | None = None) -> None:
        """One diagnosis for an incident already stored (the OOM watch's); QueueFull beyond --queue."""
        with self.admission:
            if len(self._queue) >= self.maxsize:
                raise QueueFull
            self._put(iid, target, duration)

    def _put(self, iid: str, target: Target | None, duration: float | None) -> None:
        with self._ready:
            self._queue.append((iid, target, duration))
            self._ready.notify()

    def admit(self, jobs: list[Job]) -> list[tuple[Incident, str] | None]:
        """Queue what fits of a group, in its order (admit_into); StorageFailing if the database refuses."""
        with self.admission:
            room = self.maxsize - len(self._queue)
            return admit_into(self.store, jobs, room, lambda iid, j: self._put(iid, j.target, j.duration))

    def health(self) -> str | None:
        """None when the worker can take work; else why not."""
        if not self.thread.is_alive():
            return "the diagnosis worker has stopped"
        current = self.current
        if current is not None:
            iid, started, window = current
            late = time.monotonic() - started
            if late > self.deadline(window) + REAP_S + STUCK_MARGIN_S:
                return f"the diagnosis worker is stuck: incident {iid} running for {late:.0f} s (window {window:g} s)"
        return None

    def _next(self) -> tuple[str, Target | None, float | None]:
        with self._ready:
            while not self._queue:
                self._ready.wait()
            return self._queue.popleft()

    def _loop(self) -> None:
        os.nice(10)  # per thread on Linux: the diagnoses yield the CPU to the services they watch
        while True:
            iid, target, duration = self._next()
            try:
                self._run(iid, target, duration or self.duration)
            except Exception as e:  # noqa: BLE001 (last line: even a failure to record a failure)
                print(f"memdiag serve: incident {iid}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            finally:
                self.current = None

    def _run(self, iid: str, target: Target | None, window: float) -> None:
        self.current = (iid, time.monotonic(), window)
        held: list[Target] = []
        try:
            self._diagnose_incident(iid, target, window, held)
        finally:
            # what serve held of a pid target since its alert or its lookup (system/identity.py):
            # the diagnosis ran in a child, which held its own; this process's hold ends here
            for t in held:
                identity.release(t)

    def _diagnose_incident(self, iid: str, target: Target | None, window: float, held: list[Target]) -> None:
        started = time.monotonic()
        if target is not None:
            held.append(target)
        try:
            incident = self.store.start(iid)
            if target is None:
                target = _target_again(incident)
                held.append(target)
            base = self._baseline(incident, target)  # an earlier diagnosis this one follows up
            given = baseline_facts(base[1]) if base else None
            report = self._diagnose(target, window, given)
            if base is not None:
                report = follow_up(report, base[1], base[0].report_dir or "", base[2])
            elif (scene := _scene_of(incident)) is not None:  # no earlier diagnosis: the recorder's scene
                victim = (incident.alert or {}).get("victim_comm") or "the victim"
                found = "the OOM watch, after a kill: whether what runs now grows the way the recorder saw before it"
                report = report.model_copy(update={"verification": compare_scene(scene, report, iid, victim, found)})
            folder, _ = self.store.write_report(iid, render_all(report, _recorded_scene(incident)))
        except DiagnosisKilled as e:  # what hung once likely hangs again: one retry at most
            spent = self._attempts_after_kill(incident.attempts if incident else 1)
            last = spent >= self.store.limits.max_attempts
            self.store.settle(
                iid,
                state="failed",
                error=f"{e}; not retried" if last else str(e),
                attempts=spent,
                duration_s=time.monotonic() - started,
            )
            return
        except Exception as e:  # a failed diagnosis is recorded, the worker goes on
            self.store.settle(iid, state="failed", error=_reason(e), duration_s=time.monotonic() - started)
            return
        elapsed = time.monotonic() - started
        v = report.verification
        self.store.settle(
            iid,
            state="done",
            verdict_kind=report.verdict.kind,
            summary=report.verdict.summary,
            runtime=report.target.runtime_detail or report.target.runtime,
            report_dir=folder,
            duration_s=elapsed,
            error=None,
            service=report_service(report),
            baseline=base[0].id if base else None,
            verification=v.status if v is not None else None,
            culprit=report.verdict.culprit.function,
            # in the same write as the outcome: a stop right after it still leaves the delivery to do
            notify=self.notifier.pending() if self.notifier else None,
        )
        if self.notifier:
            self.notifier.finished(iid)
        if self.on_done:
            self.on_done(elapsed, report)

    def _attempts_after_kill(self, attempts: int) -> int:
        """The attempts to record for an incident whose diagnosis was killed at its deadline: its
        first kill leaves one attempt of --max-attempts (a re-delivery or a restart retries it once),
        a later one none (the store then neither re-queues it after a restart nor on re-delivery
        within the dedupe window)."""
        cap = self.store.limits.max_attempts
        return cap if attempts >= 2 else max(attempts, cap - 1)

    def _diagnose(self, target: Target, window: float, given: dict | None) -> Report:
        """The diagnosis, in a process of its own (child.py): memdiag's own Python, started by
        fork and exec (nothing of this multi-threaded server is forked), in a session of its own so
        that at the deadline its whole process group is killed; the kernel then releases whatever
        it held (BPF links, a ptrace stop). DiagnosisFailed with the reason when it gives no report."""
        seconds = self.deadline(window)
        request = Request(target, window, self.budget, self.rules, given, self.runner)
        proc = subprocess.Popen(
            [sys.executable, "-m", "memdiag.diagnose.serve.child"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        left = False  # a killed process that did not die, left to a reaper thread
        try:
            out, _ = proc.communicate(pickle.dumps(request), timeout=seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            said = f"the diagnosis did not end within its deadline ({seconds:g} s); killed"
            if not _reaped(proc):
                left = True
                said += f", but its process is blocked in the kernel past SIGKILL (PID {proc.pid}; left to the kernel)"
            raise DiagnosisKilled(said) from None
        finally:
            if proc.poll() is None and not left:  # the worker's own failure (a broken pipe): nothing left running
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                _reaped(proc)
        kind, _, body = out.decode(errors="replace").partition("\n")
        if kind == ERROR:
            raise DiagnosisFailed(body)
        if kind != REPORT:
            raise DiagnosisFailed(f"the diagnosis's process ended by {_status(proc.returncode)} without a report")
        return Report.model_validate_json(body)

    def _baseline(self, incident: Incident | None, target: Target) -> tuple[Incident, Report, str] | None:
        """(earlier incident, its report, how this diagnosis relates to it): the one a verify names,
        or for the OOM watch's diagnosis after a kill, the service's latest that found growth."""
        if incident is None:
            return None
        if incident.baseline:
            earlier, how = self.store.get(incident.baseline), f"a follow-up of incident {incident.baseline}"
        elif incident.source == "oomwatch":
            earlier = self.store.latest_growth(service_key(target_json(target)), incident.created)
            how = "the OOM watch, after a kill: whether what runs now grows the way its service did"
        else:
            return None
        if earlier is None or earlier.report_dir is None:
            return None
        try:
            report = Report.model_validate_json(self.store.read_report(earlier.id, "report.json"))
        except (ReportGone, ValueError):  # evicted, or a report of an older memdiag: nothing to follow
            return None
        return (earlier, report, how) if incident.baseline or worth_following(report) else None


def admit_into(
    store: Store, jobs: list[Job], room: int, put: Callable[[str, Job], None]
) -> list[tuple[Incident, str] | None]:
    """Admission is per alert, so a group larger than the queue is never refused whole for room that
    cannot exist: each job needing a diagnosis takes one place while `room` lasts, a duplicate takes
    none, and a job left without room gets None (nothing stored for it: delivered again, it is taken
    then). Per job: (incident, "new" | "requeued" | "duplicate"), or None. `put` queues a diagnosis."""
    out: list[tuple[Incident, str] | None] = []
    for j in jobs:
        if room <= 0 and store.would_queue(j.dedup_key):
            out.append(None)
            continue
        incident, how = store.admit(j.source, j.target_json, j.alert, j.dedup_key)
        if how != "duplicate":
            put(incident.id, j)
            room -= 1
        out.append((incident, how))
    return out


def target_json(t: Target) -> dict:
    """A target as an incident stores it (and its service is keyed by)."""
    return {
        "kind": t.kind,
        "pid": t.pid,
        "comm": t.comm,
        "cgroup": t.cgroup.path if t.cgroup else None,
        "description": t.describe(),
        "container": t.container.model_dump() if t.container else None,
        "pod": t.pod.model_dump(exclude={"containers"}) if t.pod else None,
        # a process, not its number: a pid found again must be the same one (its start time)
        **({"start_ticks": t.start_ticks} if t.kind == "pid" else {}),
    }


def _status(code: int) -> str:
    if code >= 0:
        return f"exit status {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def _scene_of(incident: Incident | None) -> dict | None:
    """The flight recorder's scene of an OOM watch incident's kill, where it saw the cgroup grow."""
    if incident is None or incident.source != "oomwatch":
        return None
    scene = (incident.alert or {}).get("scene")
    return scene if isinstance(scene, dict) and scene.get("shape") not in (None, *NO_GROWTH) else None


def _recorded_scene(incident: Incident | None) -> Scene | None:
    """The flight recorder's scene of an OOM watch incident's kill as stored, for report.html's
    chart of it (any shape: no growth before a kill is worth seeing too); None where it has none."""
    raw = (incident.alert or {}).get("scene") if incident is not None and incident.source == "oomwatch" else None
    if not isinstance(raw, dict):
        return None
    try:
        return Scene.model_validate(raw)
    except ValueError:  # a record stored by another version: the report is written without its chart
        return None


def _reason(e: Exception) -> str:
    if isinstance(e, StorageFailing | DiagnosisFailed):
        return str(e)
    return f"{type(e).__name__}: {e}"


def _target_again(incident: Incident | None) -> Target:
    """The target of a re-queued incident, looked up again on this host (it may be gone)."""
    if incident is None:
        raise LookupError("the incident is gone from the database")
    labels = (incident.alert or {}).get("labels")
    t = incident.target or {}
    try:
        if labels and incident.source in ("alertmanager", "grafana"):
            return target_from_labels(labels)
        if t.get("kind") == "pid" and t.get("pid"):
            target = pid_target(int(t["pid"]))
            if t.get("comm") and target.comm != t["comm"]:
                identity.release(target)
                raise LookupError(f"PID {t['pid']} is now {target.comm}, not {t['comm']}: the target has exited")
            if t.get("start_ticks") is not None and target.start_ticks != t["start_ticks"]:
                identity.release(target)
                raise LookupError(f"PID {t['pid']} is another process now (it started later): the target has exited")
            return with_container(target)
        if t.get("cgroup"):
            return with_container(cgroup_target(t["cgroup"]))
        if t.get("kind") == "system":  # the root cgroup asked for (targets._as_named)
            return system_target()
    except (BadLabel, NotOnHost, UsageError) as e:
        raise LookupError(f"the target is gone: {e}") from None
    raise LookupError("nothing recorded to find the target again")
