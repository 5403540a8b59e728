"""Webhook payloads: Alertmanager (version 4) and Grafana (version 1), and memdiag's own
POST /diagnose body. Unknown keys are ignored in the alerting tools' payloads (newer versions add
fields) and refused in memdiag's own."""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, Field


class _Lenient(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Alert(_Lenient):
    status: str = Field(pattern=r"^(firing|resolved)$")
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    startsAt: str = ""  # noqa: N815 (the payload's own names)
    endsAt: str = ""  # noqa: N815
    fingerprint: str = ""

    def dedup_key(self, source: str) -> str:
        """Same fingerprint, status, startsAt and endsAt: the same notification, delivered again."""
        ident = self.fingerprint or repr(sorted(self.labels.items()))
        raw = "|".join((source, ident, self.status, self.startsAt, self.endsAt))
        return hashlib.sha256(raw.encode()).hexdigest()


class AlertmanagerPayload(_Lenient):
    version: str = "4"
    receiver: str = ""
    status: str = ""
    alerts: list[Alert] = Field(min_length=1, max_length=1000)
    groupLabels: dict[str, str] = {}  # noqa: N815
    commonLabels: dict[str, str] = {}  # noqa: N815
    commonAnnotations: dict[str, str] = {}  # noqa: N815
    groupKey: str = ""  # noqa: N815
    truncatedAlerts: int = 0  # noqa: N815


class GrafanaPayload(_Lenient):
    version: str = "1"
    state: str = ""
    status: str = ""
    receiver: str = ""
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class DiagnoseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pid: int | None = Field(None, ge=1, le=4_194_304)
    cgroup: str | None = Field(None, max_length=4096)
    container_id: str | None = Field(None, max_length=200)
    duration: float | None = Field(None, gt=0, le=600)
