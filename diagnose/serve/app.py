"""The HTTP side of `memdiag serve` (Starlette): alerts in, incidents out. Requests are answered
at once; diagnoses run in the worker."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from pydantic import ValidationError
from pydantic_core import from_json
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, Response
from starlette.responses import JSONResponse as _JSONResponse
from starlette.routing import Route

from ..errors import UsageError
from ..render.text import json_text
from ..report import Report
from ..target import Target, as_largest_process, pid_target
from ..verify import find_service
from .alerts import Alert, AlertmanagerPayload, DiagnoseRequest, GrafanaPayload
from .recorder import LISTED, MAX_LISTED
from .security import FailureLimiter, grafana_signature_ok, token_ok
from .store import STATES, ReportGone, StorageFailing, Store
from .targets import BadLabel, NotOnHost, cgroup_by_path, container_by_ref, target_from_labels
from .worker import Job, QueueFull, Worker, target_json

MAX_BODY = 1 << 20
BODY_SECONDS = 10.0  # a whole body must arrive within this: a trickling client holds nothing for long
MAX_JSON_DEPTH = 16  # an Alertmanager or Grafana payload nests 4 deep; the JSON parser stops at 200 itself
_LENGTH = re.compile(r"^[0-9]{1,12}$")
DEFAULT_PAGE, MAX_PAGE = 100, 200  # a page of incidents: at most 200 records of at most 64 KiB


@dataclass
class Config:
    store: Store
    worker: Worker
    token: str | None
    grafana_secret: str | None = None
    grafana_timestamp_header: str | None = None
    limiter: FailureLimiter | None = None
    read_token: str | None = None  # when set, reads (incidents, reports, metrics) need it or `token`
    checks: tuple[Callable[[], str | None], ...] = ()  # more health sources (the Alertmanager poller's)
    oom_watch: Any = None  # the OomWatcher (oomwatch.py) when the watch runs: /healthz says whether it is attached
    recorder: Any = None  # the flight recorder (recorder.py) when it runs: GET /cgroups reads it


def oom_watch_state(watcher) -> str:
    """What /healthz says of the OOM watch: off, starting (compiling and attaching), attached, or
    unavailable with the reason (the server runs on without it, so this is not a health problem)."""
    if watcher is None:
        return "off"
    if not watcher.ready.is_set():
        return "starting"
    return f"unavailable: {watcher.error}" if watcher.error else "attached"


def _recorder_state(recorder) -> dict | str:
    """What /healthz says of the flight recorder: off, unavailable with the reason, or its cost so far."""
    if recorder is None:
        return "off"
    return f"unavailable: {recorder.error}" if recorder.error else recorder.cost()


class Metrics:
    def __init__(self, store: Store):
        self.registry = CollectorRegistry()
        self.incidents = Gauge("memdiag_incidents", "Incidents by state", ["state"], registry=self.registry)
        self.durations = Histogram(
            "memdiag_diagnosis_seconds",
            "Time a diagnosis took",
            buckets=(5, 10, 20, 30, 45, 60, 120, 300),
            registry=self.registry,
        )
        self.overhead = Gauge(
            "memdiag_probe_overhead_percent", "Measured overhead of the last diagnosis's probes", registry=self.registry
        )
        self.oom_kills = Counter("memdiag_oom_kills", "OOM kills seen by the OOM watch", registry=self.registry)
        self.received = Counter(
            "memdiag_alerts_received", "Alerts received in webhooks", ["source"], registry=self.registry
        )
        self.deliveries = Counter(
            "memdiag_alert_deliveries",
            "Firing alerts accepted, by outcome (new, requeued, duplicate)",
            ["outcome"],
            registry=self.registry,
        )
        self.refused = Counter(
            "memdiag_alert_groups_refused",
            "Alert groups refused (429: the queue had no room for some or all of their alerts; 503: storage)",
            ["reason"],
            registry=self.registry,
        )
        self.notifications = Counter(
            "memdiag_notifications",
            "Verdicts sent to --notify destinations, by outcome (delivered; retried: failed, tried again later; "
            "failed: failed on its last attempt)",
            ["outcome"],
            registry=self.registry,
        )
        self.store = store

    def render(self) -> bytes:
        counts = self.store.counts()
        for state in STATES:
            self.incidents.labels(state=state).set(counts.get(state, 0))
        return generate_latest(self.registry)


class JSONResponse(_JSONResponse):
    """Starlette's, with DEL, the C1 controls and the format characters (a bidi override in a
    target's comm) written as \\u escapes, as report.json writes them: the same values."""

    def render(self, content: Any) -> bytes:
        return json_text(super().render(content).decode()).encode()


def _error(status: int, reason: str) -> JSONResponse:
    return JSONResponse({"error": reason}, status_code=status)


class Refused(Exception):
    """A request answered with a status and a one-line reason (and, for a group taken in part, the
    incidents that were stored)."""

    def __init__(self, status: int, reason: str, extra: dict | None = None):
        self.status, self.reason, self.extra = status, reason, extra or {}


async def _body(request: Request) -> bytes:
    """The request body, at most MAX_BODY bytes and within BODY_SECONDS, or Refused."""
    length = request.headers.get("content-length")
    if length is not None and (not _LENGTH.match(length) or int(length) > MAX_BODY):
        raise Refused(413, f"body larger than {MAX_BODY} bytes")

    async def read() -> bytes:
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY:
                raise Refused(413, f"body larger than {MAX_BODY} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    try:
        return await asyncio.wait_for(read(), BODY_SECONDS)
    except asyncio.TimeoutError:
        raise Refused(408, f"body not received within {BODY_SECONDS:g} s") from None
    except ClientDisconnect:
        raise Refused(400, "client went away before the body was complete") from None


def _too_deep(value, limit: int) -> bool:
    """Whether lists and objects nest deeper than limit (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        if depth > limit:
            return True
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return False


def _json(body: bytes):
    """Parsed JSON, bounded: size by _body, nesting by the parser's own limit and MAX_JSON_DEPTH,
    no NaN or Infinity, no invalid UTF-8 or lone surrogates (pydantic-core's Rust parser)."""
    try:
        value = from_json(body, allow_inf_nan=False)
    except ValueError as e:
        if "recursion limit" in str(e):
            raise Refused(400, f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
        raise Refused(400, f"malformed JSON: {e}") from None
    if isinstance(value, (dict, list)) and _too_deep(value, MAX_JSON_DEPTH):
        raise Refused(400, f"malformed JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    return value


def _validation(e: ValidationError) -> str:
    """One line naming the first problem; label names in it are the sender's, so it is cut short."""
    first = e.errors()[0]
    where = ".".join(str(p)[:64] for p in first["loc"])
    line = f"wrong payload shape: {where}: {first['msg']}" if where else f"wrong payload shape: {first['msg']}"
    return line[:300]


def _query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise Refused(400, f"{name} is a whole number from {low} to {high}")
    return int(raw)


def admit_jobs(worker: Worker, metrics: Metrics, jobs: list[Job]) -> list:
    """What fits of a group, queued (worker.admit_into: per job its incident and outcome, or None when
    the queue had no room for it); 503 when storage refuses."""
    try:
        return worker.admit(jobs)
    except StorageFailing as e:
        metrics.refused.labels(reason="storage").inc()
        raise Refused(503, f"cannot store the incident: {e}") from None


def _incident_item(incident, how: str) -> dict:
    item = {"id": incident.id, "state": incident.state, "new": how != "duplicate"}
    return {**item, "requeued": True, "attempts": incident.attempts} if how == "requeued" else item


def _queue_full(metrics: Metrics, left: int, firing: int, out: list[dict]) -> Refused:
    """429 for the firing alerts the queue had no room for: nothing is stored for them, so the next
    delivery of the group takes them (what this one stored is a duplicate then)."""
    metrics.refused.labels(reason="queue full").inc()
    if not out:
        return Refused(429, "diagnosis queue is full: nothing stored, deliver again later")
    return Refused(
        429,
        f"diagnosis queue is full: {left} of {firing} firing alerts not stored, deliver the group again later "
        "(the incidents listed were stored: delivered again, they are duplicates)",
        {"incidents": out},
    )


def _plans(alerts: list[Alert]) -> list[tuple[Alert, Target | None]]:
    """Each alert with its target (None: resolved), every one checked before any is acted on
    (Refused 422/404: nothing stored)."""
    plans = []
    for alert in alerts:  # per alert: a truncated group's top-level status can be wrong
        if alert.status == "resolved":
            plans.append((alert, None))
            continue
        try:
            plans.append((alert, target_from_labels(alert.labels)))
        except BadLabel as e:
            raise Refused(422, str(e)) from None
        except (NotOnHost, UsageError) as e:
            raise Refused(404, str(e)) from None
    return plans


def take_alerts(
    store: Store,
    worker: Worker,
    metrics: Metrics,
    source: str,
    alerts: list[Alert],
    resolved_summary: str = "alert resolved: recorded, not diagnosed",
) -> list[dict]:
    """The one path from alerts to incidents, for webhooks and for alerts pulled from Alertmanager
    (pull.py): every alert checked before any is acted on (Refused 422/404: nothing stored), then
    the firing ones queued as far as the queue has room (the rest Refused 429, with what was stored)
    and the resolved ones recorded. Per alert: {"id", "state", "new"} (and "requeued", "attempts"
    for a re-queued one)."""
    plans = _plans(alerts)
    jobs = [Job(source, t, target_json(t), a.model_dump(), a.dedup_key(source)) for a, t in plans if t is not None]
    admitted = admit_jobs(worker, metrics, jobs)
    left = sum(a is None for a in admitted)
    nothing = bool(jobs) and left == len(jobs)  # no room at all: the group comes again whole, resolved too
    taken, out = iter(admitted), []
    for alert, target in plans:
        if target is not None:
            if (item := next(taken)) is not None:
                metrics.deliveries.labels(outcome=item[1]).inc()
                out.append(_incident_item(*item))
        elif not nothing:
            out.append(_record_resolved(store, source, alert, resolved_summary))
    if left:
        raise _queue_full(metrics, left, len(jobs), out)
    return out


def _record_resolved(store: Store, source: str, alert: Alert, summary: str) -> dict:
    try:
        incident, new = store.record(
            source, "resolved", None, alert.model_dump(), dedup_key=alert.dedup_key(source), summary=summary
        )
    except StorageFailing as e:
        raise Refused(503, f"cannot store the incident: {e}") from None
    return {"id": incident.id, "state": incident.state, "new": new}


def _diagnose_target(req: DiagnoseRequest) -> Target:
    """The one target a POST /diagnose names (Refused 422 for none or several, or a bad label;
    404 for one not on this host)."""
    named = [k for k in ("pid", "cgroup", "container_id", "container") if getattr(req, k) is not None]
    if len(named) != 1:
        raise Refused(422, "name exactly one of pid, cgroup, container_id, container")
    try:
        if req.pid is not None:
            return pid_target(req.pid)
        if req.cgroup is not None:
            return as_largest_process(cgroup_by_path(req.cgroup))  # as a label's cgroup is
        if req.container is not None:
            return container_by_ref(req.container)
        return target_from_labels({"container_id": req.container_id or ""})
    except BadLabel as e:
        raise Refused(422, str(e)) from None
    except (NotOnHost, UsageError) as e:
        raise Refused(404, str(e).removeprefix("--pid ").removeprefix("--cgroup: ")) from None


def _incidents_html(items: list, total: int, limit: int, offset: int, more: bool) -> HTMLResponse:
    """A page of incidents as a table, with a link to the next page when there is one."""
    rows = "".join(
        f'<tr><td><a href="/incidents/{i.id}?format=html">{i.id}</a></td><td>{html.escape(i.source)}</td>'
        f"<td>{html.escape(i.state)}</td><td>{html.escape(i.verdict_kind or '')}</td>"
        f"<td>{html.escape(i.summary or i.error or '')}</td></tr>"
        for i in items
    )
    shown = f"{offset + 1 if items else offset}–{offset + len(items)} of {total}"
    link = f"/incidents?format=html&amp;limit={limit}&amp;offset={offset + limit}"
    nxt = f' <a href="{link}">next</a>' if more else ""
    return HTMLResponse(
        '<!doctype html><html><head><meta charset="utf-8"><title>memdiag incidents</title></head><body>'
        f'<h1>memdiag incidents</h1><p id="page">{shown}{nxt}</p><table id="incidents"><tr><th>id</th>'
        f"<th>source</th><th>state</th><th>verdict</th><th>summary</th></tr>{rows}</table></body></html>"
    )


REPORT_FILES = {
    "md": ("report.md", "text/markdown"),
    "json": ("report.json", "application/json"),
    "html": ("report.html", "text/html"),
    "pprof": ("profile.pb.gz", "application/octet-stream"),  # gzipped profile.proto: go tool pprof URL
}


def _related(r) -> dict:
    """An earlier incident of the same service, as listed beside a later one."""
    return {k: getattr(r, k) for k in ("id", "created", "state", "verdict_kind", "summary", "verification")}


def _report(store: Store, iid: str, item, fmt: str) -> Response:
    """One of a done incident's report files (Refused 404 before it is done, 410 once it is gone);
    a kill incident that ran no diagnosis has a page of its own: the flight recorder's scene."""
    if fmt == "html" and item.report_dir is None and item.state == "recorded" and (item.alert or {}).get("scene"):
        from memdiag.diagnose.render.html import render_scene_page  # the renderers load when used
        from memdiag.diagnose.serve.scene import Scene

        try:
            scene = Scene.model_validate(item.alert["scene"])
        except ValueError:  # a record stored by another version: said in one line, not a 500
            raise Refused(404, f"incident {iid} has no report and its recorded scene cannot be read") from None
        page = render_scene_page(f"memdiag: oom — incident {iid}", item.summary or "", scene)
        return Response(page, media_type="text/html; charset=utf-8")
    if item.report_dir is None or item.state != "done":
        raise Refused(404, f"incident {iid} has no report ({item.state})")
    name, media = REPORT_FILES[fmt]
    try:
        raw = store.read_report(iid, name)
    except ReportGone as e:
        raise Refused(410, str(e)) from None
    return Response(raw, media_type=media if fmt == "pprof" else f"{media}; charset=utf-8")


class Api:
    """The endpoints of one server: each a short handler over the shared Config and Metrics."""

    def __init__(self, cfg: Config, metrics: Metrics):
        self.cfg, self.metrics = cfg, metrics
        self.store, self.worker = cfg.store, cfg.worker

    def failed(self, request: Request, reason: str) -> Refused:
        """A failed authentication: 401, or 429 once this address has failed too often. Only
        failures count, so a sender with the right token is never refused for its address."""
        client = request.client.host if request.client else "?"
        limiter = self.cfg.limiter
        if limiter is None:
            return Refused(401, reason)
        if limiter.blocked(client):
            return Refused(429, "too many failed authentications from this address")
        limiter.failed(client)
        return Refused(401, reason)

    def guard(self, request: Request) -> None:
        if not token_ok(request.headers.get("authorization"), self.cfg.token):
            raise self.failed(request, "missing or wrong bearer token")

    def guard_read(self, request: Request) -> None:
        cfg = self.cfg
        if cfg.read_token is None:
            return
        header = request.headers.get("authorization")
        if not (token_ok(header, cfg.read_token) or (cfg.token is not None and token_ok(header, cfg.token))):
            raise self.failed(request, "missing or wrong bearer token (reads need the read token)")

    async def alerts(self, request: Request, source: str) -> Response:
        self.guard(request)
        body = await _body(request)
        cfg = self.cfg
        if source == "grafana" and cfg.grafana_secret is not None:
            ts = request.headers.get(cfg.grafana_timestamp_header) if cfg.grafana_timestamp_header else None
            if not grafana_signature_ok(
                body, request.headers.get("x-grafana-alerting-signature"), cfg.grafana_secret, ts
            ):
                raise self.failed(request, "bad X-Grafana-Alerting-Signature")
        model = AlertmanagerPayload if source == "alertmanager" else GrafanaPayload
        try:
            payload = model.model_validate(_json(body))
        except ValidationError as e:
            raise Refused(422, _validation(e)) from None
        self.metrics.received.labels(source=source).inc(len(payload.alerts))
        out = take_alerts(self.store, self.worker, self.metrics, source, payload.alerts)
        return JSONResponse({"incidents": out}, status_code=202)

    async def alertmanager(self, request: Request) -> Response:
        return await self.alerts(request, "alertmanager")

    async def grafana(self, request: Request) -> Response:
        return await self.alerts(request, "grafana")

    async def diagnose(self, request: Request) -> Response:
        self.guard(request)
        try:
            req = DiagnoseRequest.model_validate(_json(await _body(request)))
        except ValidationError as e:
            raise Refused(422, _validation(e)) from None
        target = _diagnose_target(req)
        job = Job("api", target, target_json(target), None, None, req.duration)
        (taken,) = admit_jobs(self.worker, self.metrics, [job])
        if taken is None:
            raise _queue_full(self.metrics, 1, 1, [])
        incident, _ = taken
        return JSONResponse({"id": incident.id, "state": "queued"}, status_code=202)

    async def incidents(self, request: Request) -> Response:
        self.guard_read(request)
        limit = _query_int(request, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
        offset = _query_int(request, "offset", 0, 0, 1 << 62)
        items, total = self.store.page(limit, offset)
        more = offset + len(items) < total
        if request.query_params.get("format") == "html" or "text/html" in request.headers.get("accept", ""):
            return _incidents_html(items, total, limit, offset, more)
        return JSONResponse(
            {
                "incidents": [i.model_dump() for i in items],
                "total": total,
                "limit": limit,
                "offset": offset,
                "next_offset": offset + limit if more else None,
            }
        )

    async def incident(self, request: Request) -> Response:
        self.guard_read(request)
        iid = request.path_params["iid"]
        if not iid.isalnum() or len(iid) > 32:
            raise Refused(404, "no such incident")
        item = self.store.get(iid)
        if item is None:
            raise Refused(404, "no such incident")
        fmt = request.query_params.get("format")
        if fmt in REPORT_FILES:
            return _report(self.store, iid, item, fmt)
        if fmt is not None:
            raise Refused(400, "format is md, json, html or pprof")
        related = [_related(r) for r in self.store.related(item)]  # its service's earlier incidents
        return JSONResponse({**item.model_dump(), "related": related})

    async def verify(self, request: Request) -> Response:
        """Follow a done incident's diagnosis into a new one of the same service (after a fix)."""
        self.guard(request)
        iid = request.path_params["iid"]
        item = self.store.get(iid) if iid.isalnum() and len(iid) <= 32 else None
        if item is None:
            raise Refused(404, "no such incident")
        if item.state != "done" or item.report_dir is None:
            raise Refused(409, f"incident {iid} has no report to verify against ({item.state})")
        try:
            base = Report.model_validate_json(self.store.read_report(iid, "report.json"))
        except ReportGone as e:
            raise Refused(410, str(e)) from None
        except ValueError:
            raise Refused(409, f"incident {iid}'s report is not one this memdiag reads (an older version)") from None
        try:
            target, _how = find_service(base)
        except UsageError as e:
            raise Refused(422, f"the service of incident {iid} cannot be found again: {e}") from None
        incident = self.store.admit_verify(iid, target_json(target))
        try:
            self.worker.submit(incident.id, target)
        except QueueFull:
            self.store.settle(incident.id, state="failed", error="queue full: not diagnosed; ask again later")
            raise _queue_full(self.metrics, 1, 1, []) from None
        return JSONResponse({"id": incident.id, "state": "queued", "baseline": iid}, status_code=202)

    async def cgroups(self, request: Request) -> Response:
        """The flight recorder: every cgroup it keeps with its latest values, or one cgroup's series
        and its processes' (?path=/system.slice/x.service; ?since=UNIX-TIME for the latest only;
        ?processes=N, the live ones largest first, then the latest ended)."""
        self.guard_read(request)
        recorder = self.cfg.recorder
        if recorder is None:
            raise Refused(404, "the flight recorder is off (memdiag serve --no-recorder)")
        path = request.query_params.get("path")
        if path is None:
            return JSONResponse(await run_in_threadpool(recorder.index))
        if not path.startswith("/") or len(path) > 4096:
            raise Refused(400, "path is a cgroup's path inside the memory hierarchy, from /")
        since = request.query_params.get("since", "0")
        try:
            since_t = float(since)
        except ValueError:
            raise Refused(400, "since is a Unix time in seconds") from None
        listed = _query_int(request, "processes", LISTED, 1, MAX_LISTED)
        # built off the event loop: a cgroup of a thousand processes is a few MiB of points
        found = await run_in_threadpool(recorder.lookback, path, since_t if since_t == since_t else 0.0, listed)
        if found is None:
            raise Refused(404, f"the recorder keeps no cgroup {path}")
        return JSONResponse(found)

    async def healthz(self, request: Request) -> Response:
        # ?scope=process: only what a restart of this process could mend (a liveness probe's question),
        # not the services it depends on (an Alertmanager down is no reason to kill a diagnosis)
        others = () if request.query_params.get("scope") == "process" else (c() for c in self.cfg.checks)
        worker = self.worker
        recorder = self.cfg.recorder.health() if self.cfg.recorder is not None else None  # this process's own
        problems = [p for p in (worker.health(), self.store.health(), recorder, *others) if p]
        body = {
            "ok": not problems,
            "queued": worker.qsize(),
            "running": worker.current[0] if worker.current else None,
            "oom_watch": oom_watch_state(self.cfg.oom_watch),
            "recorder": _recorder_state(self.cfg.recorder),
        }
        if problems:
            return JSONResponse({**body, "reason": "; ".join(problems)}, status_code=503)
        return JSONResponse(body)

    async def metrics_endpoint(self, request: Request) -> Response:
        self.guard_read(request)
        return Response(self.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    def routes(self) -> list[Route]:
        return [
            Route("/alerts/alertmanager", self.alertmanager, methods=["POST"]),
            Route("/alerts/grafana", self.grafana, methods=["POST"]),
            Route("/diagnose", self.diagnose, methods=["POST"]),
            Route("/incidents", self.incidents, methods=["GET"]),
            Route("/incidents/{iid}", self.incident, methods=["GET"]),
            Route("/incidents/{iid}/verify", self.verify, methods=["POST"]),
            Route("/cgroups", self.cgroups, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
        ]


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, Refused)
    return JSONResponse({"error": exc.reason, **exc.extra}, status_code=exc.status)


async def _not_found(request: Request, exc: Exception) -> Response:
    return _error(getattr(exc, "status_code", 404), getattr(exc, "detail", "not found") or "not found")


async def _unexpected(request: Request, exc: Exception) -> Response:
    # A bug or a failing disk, not the request's fault: 503 tells Alertmanager to deliver again.
    # Starlette still raises it on, so the traceback reaches the log.
    return _error(503, f"internal error ({type(exc).__name__}); deliver again later")


def create_app(cfg: Config, metrics: Metrics) -> Starlette:
    handlers = {Refused: _refused, 404: _not_found, 405: _not_found, Exception: _unexpected}
    return Starlette(routes=Api(cfg, metrics).routes(), exception_handlers=handlers)
