"""Incidents in SQLite under --data, reports as folders beside it: one server per folder (an
exclusive lock), owner-only modes, no symlink followed (the folder and its paths: datadir.py),
bounded in count and bytes, and never a lost outcome (a terminal state the database refuses is
kept in memory and written later).

Delivery rules (at-least-once): an alert key that is queued or running, or finished within the
dedupe window, is a duplicate; anything else (failed, interrupted, or finished before the window)
is re-queued on the same incident, with the attempt count and the previous outcome kept. A
diagnosis cut off by a restart is re-queued when the store opens, up to `max_attempts` times."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memdiag.system._parse import Model

from .cases import RELATED, service_key
from .datadir import DataDir

STATES = ("queued", "running", "done", "failed", "interrupted", "resolved", "recorded")
ACTIVE = ("queued", "running")
FINISHED = ("done", "failed", "interrupted", "resolved", "recorded")  # evictable, oldest first
DB_NAME = "incidents.sqlite3"
MIN_FREE = 1 << 20  # less free space than this in --data: storage is failing (a report needs room)
BUSY_MS = 2_000  # how long a write waits for a database locked by another process before it fails (only
# another process can hold it: this one's writes are serialized by the store's own lock)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    source TEXT NOT NULL,
    dedup_key TEXT UNIQUE,
    state TEXT NOT NULL,
    target TEXT,
    alert TEXT,
    verdict_kind TEXT,
    summary TEXT,
    report_dir TEXT,
    error TEXT,
    duration_s REAL
);
"""
# Columns added after the first release: added to older databases when they open.
_ADDED = {
    "attempts": "INTEGER NOT NULL DEFAULT 0",
    "previous": "TEXT",
    "report_bytes": "INTEGER NOT NULL DEFAULT 0",
    "runtime": "TEXT",
    "service": "TEXT",  # what stays the same across restarts (cases.service_key)
    "baseline": "TEXT",  # the earlier incident this one's diagnosis follows up (verify)
    "verification": "TEXT",  # what that follow-up found: fixed, still-leaking, new-growth, inconclusive
    "culprit": "TEXT",  # the verdict's culprit function, as the report names it
    "notify": "TEXT",  # JSON: its delivery to the --notify destinations (notify.py), when serve notifies
}
_COLS = (
    "id, created, updated, source, state, target, alert, verdict_kind, summary, report_dir, error, duration_s, "
    "attempts, previous, runtime, service, baseline, verification, culprit, notify"
)
_JSON_COLS = ("target", "alert", "notify")


@dataclass(frozen=True)
class Limits:
    max_incidents: int = 10_000
    max_report_bytes: int = 512 << 20
    # A done diagnosis suppresses re-deliveries of its alert for this long. Alertmanager re-sends a
    # still-firing alert (same fingerprint and startsAt, endsAt the zero time) every repeat_interval
    # (4 h by default): a day is longer, so routine re-sends do not each cost a traced diagnosis,
    # while a problem still firing the next day gets a fresh look.
    dedupe_window: float = 86_400.0
    max_attempts: int = 3  # diagnoses started per alert before it stays failed (a crash loop ends)
    max_value_chars: int = 4096  # per string stored from an alert (annotations, labels)
    max_record_bytes: int = 64 << 10  # per stored alert record


class Incident(Model):
    id: str
    created: float
    updated: float
    source: str
    state: str
    target: dict[str, Any] | None = None
    alert: dict[str, Any] | None = None
    verdict_kind: str | None = None
    summary: str | None = None
    report_dir: str | None = None
    error: str | None = None
    duration_s: float | None = None
    attempts: int = 0
    previous: str | None = None  # why the attempt before this one did not finish (or what it found)
    runtime: str | None = None  # the diagnosed target's runtime: Go 1.19.8 (/usr/bin/prometheus; ...), none
    service: str | None = None  # the service it concerns, across restarts (serve/cases.py)
    baseline: str | None = None  # the earlier incident its diagnosis followed up
    verification: str | None = None  # fixed, still-leaking, new-growth or inconclusive, against the baseline
    culprit: str | None = None  # the function the verdict names (report.verdict.culprit.function)
    # its verdict's delivery to --notify's destinations (notify.py): state (pending, retrying, delivered,
    # failed), attempts, the last error, per destination (its URL redacted); None when serve did not notify
    notify: dict[str, Any] | None = None


class StorageFailing(Exception):
    """A database or report write failed; the reason is kept for /healthz."""


class ReportGone(LookupError):
    """The incident had a report but its file is no longer there."""


def bound_record(record: dict, limits: Limits) -> dict:
    """The alert as stored: long strings cut (and named under `truncated`), the whole record
    capped; what intake accepted is never refused here, only shortened."""
    cut: list[str] = []

    def walk(value, where: str):
        if isinstance(value, str) and len(value) > limits.max_value_chars:
            cut.append(where)
            return value[: limits.max_value_chars] + f"… [truncated, {len(value)} characters]"
        if isinstance(value, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    out = walk(record, "")
    if len(json.dumps(out)) > limits.max_record_bytes:
        for bulky in ("annotations", "labels"):
            if bulky in out and len(json.dumps(out)) > limits.max_record_bytes:
                out[bulky] = {"_dropped": f"{bulky} over {limits.max_record_bytes} bytes: not stored"}
                cut.append(bulky)
    if cut:
        out["truncated"] = cut
    return out


class Store:
    def __init__(self, data: Path, limits: Limits | None = None):
        self.limits = limits or Limits()
        self._lock = threading.Lock()
        self.failure: str | None = None  # the last storage error, until a write succeeds again
        self._pending: dict[str, dict[str, Any]] = {}  # terminal updates the database refused
        self.dir = DataDir(data)  # checked, open and locked (UnsafeData, DataInUse)
        try:
            self.data = self.dir.path
            self.reports = self.data / "reports"
            self.dir.prepare_reports()
            self._db = self._open_db()
            self.resumed = self._recover()
        except BaseException:
            self.dir.close()
            raise

    # -- opening ---------------------------------------------------------------------------------

    def _open_db(self) -> sqlite3.Connection:
        names = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", DB_NAME + "-journal")
        for name in names:
            self.dir.no_symlink(name)
        self.dir.create(DB_NAME)  # SQLite gives -wal/-shm its mode
        db = sqlite3.connect(self.data / DB_NAME, check_same_thread=False, isolation_level=None, timeout=BUSY_MS / 1000)
        db.execute("PRAGMA journal_mode=WAL")
        db.executescript(_SCHEMA)
        have = {r[1] for r in db.execute("PRAGMA table_info(incidents)")}
        for col, decl in _ADDED.items():
            if col not in have:
                db.execute(f"ALTER TABLE incidents ADD COLUMN {col} {decl}")
        db.execute("CREATE INDEX IF NOT EXISTS incidents_service ON incidents (service, created)")
        for name in names[:3]:
            self.dir.owner_only(name)
        return db

    def _recover(self) -> list[Incident]:
        """Work cut off by a stop: re-queued (and it says so), or failed once attempts are spent."""
        now, cap = time.time(), self.limits.max_attempts
        rows = self._db.execute(
            "SELECT id, state, attempts FROM incidents WHERE state IN ('queued', 'running') ORDER BY created"
        ).fetchall()
        for iid, state, attempts in rows:
            if state == "running" and attempts >= cap:
                self._db.execute(
                    "UPDATE incidents SET state='failed', updated=?, error=? WHERE id=?",
                    (
                        now,
                        f"interrupted in each of {attempts} attempts (memdiag serve stopped during the "
                        "diagnosis): not retried",
                        iid,
                    ),
                )
                continue
            why = (
                f"attempt {attempts} interrupted: memdiag serve stopped during the diagnosis; resumed after restart"
                if state == "running"
                else "waiting when memdiag serve stopped; re-queued after restart"
            )
            self._db.execute("UPDATE incidents SET state='queued', updated=?, previous=? WHERE id=?", (now, why, iid))
        return [i for i in (self._get(r[0]) for r in rows) if i is not None and i.state == "queued"]

    def close(self) -> None:
        with self._lock:
            self._db.close()
            self.dir.close()

    # -- intake ----------------------------------------------------------------------------------

    def would_queue(self, dedup_key: str | None) -> bool:
        """Whether `admit` would queue a diagnosis for this key (for the all-or-nothing check)."""
        with self._lock:
            return self._decide(dedup_key)[0] != "duplicate"

    def _decide(self, key: str | None) -> tuple[str, tuple | None]:
        if key is None:
            return "new", None
        row = self._db.execute(
            "SELECT id, state, updated, attempts, error, verdict_kind, summary FROM incidents WHERE dedup_key=?",
            (key,),
        ).fetchone()
        if row is None:
            return "new", None
        iid, state, updated, attempts, *_ = row
        state = self._pending.get(iid, {}).get("state", state)
        recent = time.time() - updated < self.limits.dedupe_window
        if state in ACTIVE or (recent and (state == "done" or attempts >= self.limits.max_attempts)):
            return "duplicate", row
        return "requeue", row

    def admit(
        self, source: str, target: dict | None, alert: dict | None, dedup_key: str | None
    ) -> tuple[Incident, str]:
        """Queue a diagnosis: ("new" | "requeued" | "duplicate"). Raises StorageFailing."""
        with self._lock:
            how, row = self._decide(dedup_key)
            if how == "duplicate":
                return self._get(row[0]), "duplicate"  # type: ignore[index,return-value]
            if how == "requeue":
                iid, state, _, attempts, error, kind, summary = row  # type: ignore[misc]
                before = (
                    f"done earlier: {kind}: {summary}" if state == "done" else f"attempt {attempts} {state}: {error}"
                )
                fresh = state == "done" or attempts >= self.limits.max_attempts  # past the window: a new round
                with contextlib.suppress(OSError):  # the old report goes: one incident, its latest outcome
                    self.dir.remove_report(iid)
                self._write(
                    "UPDATE incidents SET state='queued', updated=?, previous=?, attempts=?, error=NULL, "
                    "verdict_kind=NULL, summary=NULL, runtime=NULL, report_dir=NULL, report_bytes=0, duration_s=NULL, "
                    "culprit=NULL, notify=NULL "
                    "WHERE id=?",
                    (time.time(), before, 0 if fresh else attempts, iid),
                )
                self._pending.pop(iid, None)
                return self._get(iid), "requeued"  # type: ignore[return-value]
            return self._insert(source, "queued", target, alert, dedup_key, None), "new"

    def record(
        self, source: str, state: str, target: dict | None, alert: dict | None, dedup_key=None, summary=None
    ) -> tuple[Incident, bool]:
        """An incident that is not diagnosed (resolved alert, OOM kill record); False if seen before."""
        with self._lock:
            if dedup_key is not None:
                row = self._db.execute("SELECT id FROM incidents WHERE dedup_key=?", (dedup_key,)).fetchone()
                if row:
                    return self._get(row[0]), False  # type: ignore[return-value]
            incident = self._insert(source, state, target, alert, dedup_key, summary)
            self._evict()
            return incident, True

    def _insert(self, source, state, target, alert, dedup_key, summary, baseline=None) -> Incident:
        now, iid = time.time(), uuid.uuid4().hex[:16]
        stored = bound_record(alert, self.limits) if alert else None
        self._write(
            "INSERT INTO incidents (id, created, updated, source, dedup_key, state, target, alert, summary, "
            "service, baseline) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                iid,
                now,
                now,
                source,
                dedup_key,
                state,
                json.dumps(target) if target else None,
                json.dumps(stored) if stored else None,
                summary,
                service_key(target),
                baseline,
            ),
        )
        return self._get(iid)  # type: ignore[return-value]

    def admit_verify(self, baseline: str, target: dict) -> Incident:
        """A follow-up of an earlier incident's diagnosis, queued (POST /incidents/ID/verify)."""
        with self._lock:
            incident = self._insert("verify", "queued", target, None, None, None, baseline=baseline)
            self._evict()
            return incident

    def related(self, incident: Incident) -> list[Incident]:
        """The earlier incidents of the same service, newest first (RELATED of them)."""
        if incident.service is None:
            return []
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_COLS} FROM incidents WHERE service=? AND created<? AND id!=? "  # noqa: S608
                "ORDER BY created DESC LIMIT ?",
                (incident.service, incident.created, incident.id, RELATED),
            ).fetchall()
            return [self._overlay(_incident(r)) for r in rows]

    def latest_growth(self, service: str | None, before: float) -> Incident | None:
        """The service's latest diagnosis before `before` that found growth and kept its report."""
        if service is None:
            return None
        with self._lock:
            row = self._db.execute(
                f"SELECT {_COLS} FROM incidents WHERE service=? AND created<? AND state='done' "  # noqa: S608
                "AND verdict_kind IN ('leak', 'growth') AND report_dir IS NOT NULL ORDER BY created DESC LIMIT 1",
                (service, before),
            ).fetchone()
            return self._overlay(_incident(row)) if row else None

    # -- the worker's side -----------------------------------------------------------------------

    def start(self, iid: str) -> Incident | None:
        """Mark running and count the attempt (the count survives a crash: it caps crash loops)."""
        with self._lock:
            with contextlib.suppress(StorageFailing):  # run anyway: the outcome is kept in memory if need be
                self._write(
                    "UPDATE incidents SET state='running', attempts=attempts+1, updated=? WHERE id=?",
                    (time.time(), iid),
                )
            return self._get(iid)

    def settle(self, iid: str, **fields: Any) -> None:
        """A terminal outcome. Never raises: a refused write is kept and retried (flush, health)."""
        fields["updated"] = time.time()
        with self._lock:
            self._pending[iid] = {**self._pending.get(iid, {}), **fields}
            self._flush()
            if not self._pending:
                with contextlib.suppress(StorageFailing, OSError):
                    self._evict()

    def note(self, iid: str, notify: dict) -> None:
        """An incident's notification state (notify.py), its `updated` time left alone (the dedupe
        window and eviction run from the diagnosis). Never raises: kept as settle keeps outcomes."""
        with self._lock:
            self._pending[iid] = {**self._pending.get(iid, {}), "notify": notify}
            self._flush()

    def unnotified(self) -> list[str]:
        """Done incidents whose verdict a notifier has still to deliver (pending or retrying when
        serve stopped), oldest first: the notifier takes them up again when serve starts."""
        with self._lock:
            rows = self._db.execute(
                "SELECT id FROM incidents WHERE state='done' AND json_extract(notify, '$.state') "
                "IN ('pending', 'retrying') ORDER BY updated"
            ).fetchall()
            return [r[0] for r in rows]

    def _flush(self) -> None:
        for iid in list(self._pending):
            fields = self._pending[iid]
            cols = ", ".join(f"{k}=?" for k in fields)
            values = (json.dumps(v) if k in _JSON_COLS and v is not None else v for k, v in fields.items())
            try:
                self._write(f"UPDATE incidents SET {cols} WHERE id=?", (*values, iid))  # noqa: S608
            except StorageFailing:
                return
            del self._pending[iid]

    def _write(self, sql: str, params: tuple) -> None:
        try:
            self._db.execute(sql, params)
        except sqlite3.Error as e:
            self.failure = f"database: {e}"
            raise StorageFailing(self.failure) from None

    def write_report(self, iid: str, files: Mapping[str, str | bytes]) -> tuple[str, int]:
        """Write reports/<id>/<name> without following any symlink (datadir.py); (folder, bytes). On
        any error nothing half-written is left and StorageFailing says why."""
        folder = self.reports / iid
        try:
            size = self.dir.write_report(iid, files)
        except OSError as e:
            self.failure = f"writing the report: {e.strerror or e}"
            where = "" if self.dir.reports_problem() else f" ({folder})"  # the problem names the folder
            raise StorageFailing(f"writing the report: {e.strerror or e}{where}") from None
        with self._lock, contextlib.suppress(StorageFailing):
            self._write("UPDATE incidents SET report_bytes=? WHERE id=?", (size, iid))
        return str(folder), size

    def read_report(self, iid: str, name: str) -> bytes:
        try:
            return self.dir.read_report(iid, name)
        except FileNotFoundError:
            raise ReportGone(f"the report file {name} of incident {iid} is gone (evicted or removed)") from None
        except OSError as e:
            raise ReportGone(f"the report file {name} of incident {iid} cannot be read: {e.strerror}") from None

    # -- bounds and health -----------------------------------------------------------------------

    def _evict(self) -> None:
        """Oldest finished incidents (and their report folders) go while a cap is exceeded."""
        lim = self.limits
        while True:
            count, size = self._db.execute("SELECT COUNT(*), COALESCE(SUM(report_bytes), 0) FROM incidents").fetchone()
            if count <= lim.max_incidents and size <= lim.max_report_bytes:
                return
            over = max(count - lim.max_incidents, 1)
            marks = ",".join("?" * len(FINISHED))
            victims = [
                r[0]
                for r in self._db.execute(
                    f"SELECT id FROM incidents WHERE state IN ({marks}) ORDER BY updated LIMIT ?",  # noqa: S608
                    (*FINISHED, min(over, 100)),
                )
                if r[0] not in self._pending
            ]
            if not victims:
                return  # only active work left: it finishes first
            for iid in victims:
                with contextlib.suppress(OSError):
                    self.dir.remove_report(iid)
                self._write("DELETE FROM incidents WHERE id=?", (iid,))

    def health(self) -> str | None:
        """None when storage works; else why not. Retries kept outcomes and probes the disk."""
        with self._lock:
            if self.failure is not None or self._pending:
                self._db.execute("PRAGMA busy_timeout=200")  # a locked database must not hang /healthz
                try:
                    self._flush()
                finally:
                    self._db.execute(f"PRAGMA busy_timeout={BUSY_MS}")
                self._probe()
            free = self.dir.free_bytes()
            if self._pending:
                return f"storage failing ({len(self._pending)} outcomes kept in memory): {self.failure}"
            if self.failure is not None:
                return f"storage failing: {self.failure}"
            if free < MIN_FREE:
                return f"storage failing: {free} bytes free in {self.data} (under {MIN_FREE})"
            problem = self.dir.reports_problem()
            return f"storage failing: {problem}" if problem else None

    def _probe(self) -> None:
        """Clear the kept failure if a small file can be written again."""
        try:
            self.dir.probe(".healthz-probe", 64 << 10)  # room for at least a small report
        except OSError as e:
            self.failure = f"writing to {self.data}: {e.strerror or e}"
        else:
            if not self._pending:
                self.failure = None

    # -- reading ---------------------------------------------------------------------------------

    def _get(self, iid: str) -> Incident | None:
        row = self._db.execute(f"SELECT {_COLS} FROM incidents WHERE id=?", (iid,)).fetchone()  # noqa: S608
        return self._overlay(_incident(row)) if row else None

    def _overlay(self, incident: Incident) -> Incident:
        kept = self._pending.get(incident.id)
        return incident.model_copy(update=kept) if kept else incident

    def get(self, iid: str) -> Incident | None:
        with self._lock:
            return self._get(iid)

    def page(self, limit: int, offset: int) -> tuple[list[Incident], int]:
        """Newest first: one page, and the total."""
        with self._lock:
            total = self._db.execute("SELECT COUNT(*) FROM incidents").fetchone()[0]
            rows = self._db.execute(
                f"SELECT {_COLS} FROM incidents ORDER BY created DESC, id LIMIT ? OFFSET ?",  # noqa: S608
                (limit, offset),
            ).fetchall()
            return [self._overlay(_incident(r)) for r in rows], total

    def all(self, limit: int = 500) -> list[Incident]:
        return self.page(limit, 0)[0]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT id, state FROM incidents WHERE state IN ('queued', 'running')").fetchall()
            counts = dict(self._db.execute("SELECT state, COUNT(*) FROM incidents GROUP BY state").fetchall())
        for iid, state in rows:  # outcomes kept in memory count as what they are
            kept = self._pending.get(iid, {}).get("state")
            if kept and kept != state:
                counts[state] -= 1
                counts[kept] = counts.get(kept, 0) + 1
        return counts


def _incident(row) -> Incident:
    d = dict(zip(_COLS.split(", "), row, strict=True))
    for k in _JSON_COLS:
        d[k] = json.loads(d[k]) if d[k] else None
    return Incident(**d)
