"""Webhook payloads: Alertmanager (version 4) and Grafana (version 1), and memdiag's own
POST /diagnose body. Unknown keys are ignored in the alerting tools' payloads (newer versions add
fields) and refused in memdiag's own. Types are strict (`{"pid": true}` is not pid 1, "1" is not 1)
and every label and annotation map is bounded at intake: what is stored is what passed here."""

from __future__ import annotations

import hashlib
import re
from typing import Annotated

from memdiag.system._parse import Model
from pydantic import ConfigDict, Field, model_validator

MAX_LABELS = 64  # pairs in one labels or annotations map
MAX_KEY = 128  # characters in a label name
MAX_LABEL_VALUE = 1024
MAX_ANNOTATION_VALUE = 8192
MAX_ALERT_TEXT = 32 * 1024  # labels and annotations of one alert together, in characters

_Key = Annotated[str, Field(min_length=1, max_length=MAX_KEY)]
Labels = Annotated[dict[_Key, Annotated[str, Field(max_length=MAX_LABEL_VALUE)]], Field(max_length=MAX_LABELS)]
Annotations = Annotated[
    dict[_Key, Annotated[str, Field(max_length=MAX_ANNOTATION_VALUE)]], Field(max_length=MAX_LABELS)
]
_Short = Annotated[str, Field(max_length=256)]
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)$")


class _Lenient(Model):
    model_config = ConfigDict(extra="ignore", strict=True)


class Alert(_Lenient):
    status: str = Field(pattern=r"^(firing|resolved)$")
    labels: Labels = {}
    annotations: Annotations = {}
    startsAt: _Short = ""  # noqa: N815 (the payload's own names)
    endsAt: _Short = ""  # noqa: N815
    fingerprint: _Short = ""

    @model_validator(mode="after")
    def _bounded(self) -> Alert:
        size = sum(len(k) + len(v) for m in (self.labels, self.annotations) for k, v in m.items())
        if size > MAX_ALERT_TEXT:
            raise ValueError(f"labels and annotations of one alert exceed {MAX_ALERT_TEXT} characters")
        return self

    def dedup_key(self, source: str) -> str:
        """Same fingerprint, status, startsAt and endsAt: the same notification, delivered again."""
        ident = self.fingerprint or repr(sorted(self.labels.items()))
        raw = "|".join((source, ident, self.status, _millis(self.startsAt), _millis(self.endsAt)))
        return hashlib.sha256(raw.encode()).hexdigest()


def _millis(stamp: str) -> str:
    """An RFC 3339 time to milliseconds: Alertmanager's webhooks carry nanoseconds
    (2026-12-01T02:59:31.54955362Z), its API v2 milliseconds (…31.549Z); one alert, one key."""
    m = _STAMP.match(stamp)
    return f"{m[1]}.{((m[2] or '') + '000')[:3]}{m[3]}" if m else stamp


class AlertmanagerPayload(_Lenient):
    version: _Short = "4"
    receiver: _Short = ""
    status: _Short = ""
    alerts: list[Alert] = Field(min_length=1, max_length=1000)
    groupLabels: Labels = {}  # noqa: N815
    commonLabels: Labels = {}  # noqa: N815
    commonAnnotations: Annotations = {}  # noqa: N815
    groupKey: Annotated[str, Field(max_length=MAX_ALERT_TEXT)] = ""  # noqa: N815
    truncatedAlerts: int = Field(0, ge=0)  # noqa: N815


class GrafanaPayload(_Lenient):
    version: _Short = "1"
    state: _Short = ""
    status: _Short = ""
    receiver: _Short = ""
    alerts: list[Alert] = Field(min_length=1, max_length=1000)


class DiagnoseRequest(Model):
    model_config = ConfigDict(extra="forbid", strict=True)

    pid: int | None = Field(None, ge=1, le=4_194_304)
    cgroup: str | None = Field(None, min_length=1, max_length=4096)
    container_id: str | None = Field(None, max_length=200)
    container: str | None = Field(None, min_length=1, max_length=260)  # an id, a 12+ digit id prefix or a name
    duration: float | None = Field(None, gt=0, le=600, allow_inf_nan=False)
