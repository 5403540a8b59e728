"""Incidents in SQLite under --data, reports as folders beside it (owner-only). A diagnosis cut
off by a restart is marked interrupted when the store opens again."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel

STATES = ("queued", "running", "done", "failed", "interrupted", "resolved", "recorded")

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


class Incident(BaseModel):
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


class Store:
    def __init__(self, data: Path):
        self.data = data
        data.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.reports = data / "reports"
        self.reports.mkdir(exist_ok=True, mode=0o700)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(data / "incidents.sqlite3", check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)
        now = time.time()
        self._db.execute(
            "UPDATE incidents SET state='interrupted', updated=?, error='memdiag serve stopped during the diagnosis' "
            "WHERE state IN ('running', 'queued')",
            (now,),
        )

    def create(
        self,
        source: str,
        state: str,
        target: dict | None,
        alert: dict | None,
        dedup_key: str | None = None,
        summary: str | None = None,
    ) -> tuple[Incident, bool]:
        """The incident, and whether it is new (False: the same alert was delivered before)."""
        with self._lock:
            if dedup_key is not None:
                row = self._db.execute("SELECT id FROM incidents WHERE dedup_key=?", (dedup_key,)).fetchone()
                if row:
                    return self._get(row[0]), False  # type: ignore[return-value]
            now = time.time()
            iid = uuid.uuid4().hex[:16]
            self._db.execute(
                "INSERT INTO incidents (id, created, updated, source, dedup_key, state, target, alert, summary) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    iid,
                    now,
                    now,
                    source,
                    dedup_key,
                    state,
                    json.dumps(target) if target else None,
                    json.dumps(alert) if alert else None,
                    summary,
                ),
            )
            return self._get(iid), True  # type: ignore[return-value]

    def update(self, iid: str, **fields: Any) -> None:
        fields["updated"] = time.time()
        cols = ", ".join(f"{k}=?" for k in fields)
        with self._lock:
            self._db.execute(f"UPDATE incidents SET {cols} WHERE id=?", (*fields.values(), iid))  # noqa: S608

    def _get(self, iid: str) -> Incident | None:
        row = self._db.execute(
            "SELECT id, created, updated, source, state, target, alert, verdict_kind, summary, report_dir, error, "
            "duration_s FROM incidents WHERE id=?",
            (iid,),
        ).fetchone()
        return _incident(row) if row else None

    def get(self, iid: str) -> Incident | None:
        with self._lock:
            return self._get(iid)

    def all(self, limit: int = 500) -> list[Incident]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, created, updated, source, state, target, alert, verdict_kind, summary, report_dir, error, "
                "duration_s FROM incidents ORDER BY created DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [_incident(r) for r in rows]

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*) FROM incidents GROUP BY state").fetchall()
        return {state: n for state, n in rows}

    def report_dir(self, iid: str) -> Path:
        d = self.reports / iid
        d.mkdir(mode=0o700, exist_ok=True)
        return d


def _incident(row) -> Incident:
    keys = (
        "id",
        "created",
        "updated",
        "source",
        "state",
        "target",
        "alert",
        "verdict_kind",
        "summary",
        "report_dir",
        "error",
        "duration_s",
    )
    d = dict(zip(keys, row, strict=True))
    for k in ("target", "alert"):
        d[k] = json.loads(d[k]) if d[k] else None
    return Incident(**d)
