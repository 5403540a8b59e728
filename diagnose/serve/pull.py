"""Node agent mode: the firing alerts of this node pulled from Alertmanager's API v2 every --poll
seconds, so each node's `memdiag serve` diagnoses only its own targets and no router is needed.

Alertmanager applies silences and inhibitions: only alerts it reports as `active` (not
`suppressed`, not yet `unprocessed`) are taken. A pulled alert goes the webhook's way
(app.take_alerts, keyed as Alertmanager's webhook keys it: re-polling the same alert, or a webhook
for it, is a duplicate). An alert taken earlier that is no longer active is recorded with what
Alertmanager said of it; it stops nothing that is running. Failures to reach Alertmanager never
stop the server: polling backs off, /healthz reports them after FAILURES_UNHEALTHY in a row, and
the log gets one line when polling starts failing and one when it works again."""

from __future__ import annotations

import re
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Annotated
from urllib.parse import urlencode, urlsplit

from memdiag.system._parse import Model
from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic_core import from_json

from ..errors import UsageError
from .alerts import Alert, Annotations, Labels
from .app import Refused

ZERO_TIME = "0001-01-01T00:00:00Z"  # a firing alert's endsAt in Alertmanager's webhooks
NODE_LABEL = "node"  # the label the shipped rules (deploy/prometheus) put the node name in
NODE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")  # a Kubernetes node or host name
FAILURES_UNHEALTHY = 3  # polls failed in a row before /healthz says so (one lost poll is no outage)
MAX_BACKOFF_S = 60.0  # a failing Alertmanager is polled at least this often (or every --poll, if longer)
MAX_RESPONSE = 16 << 20
MAX_ALERTS = 10_000
TIMEOUT_S = 10.0
_Short = Annotated[str, Field(max_length=256)]


class _Status(Model):
    model_config = ConfigDict(extra="ignore", strict=True)
    state: _Short
    silencedBy: list[_Short] = []  # noqa: N815 (the API's own names)
    inhibitedBy: list[_Short] = []  # noqa: N815


class PulledAlert(Model):
    """One alert of GET /api/v2/alerts (gettableAlert), bounded as webhook alerts are."""

    model_config = ConfigDict(extra="ignore", strict=True)
    labels: Labels
    annotations: Annotations = {}
    startsAt: _Short  # noqa: N815
    endsAt: _Short = ""  # noqa: N815
    fingerprint: _Short
    status: _Status

    def as_alert(self) -> Alert:
        """The alert as Alertmanager's webhook carries it while it fires (same dedupe key)."""
        return Alert(
            status="firing",
            labels=self.labels,
            annotations=self.annotations,
            startsAt=self.startsAt,
            endsAt=ZERO_TIME,
            fingerprint=self.fingerprint,
        )

    def said(self) -> str:
        """What Alertmanager says of it, for the record."""
        if self.status.silencedBy:
            return f"silenced by {', '.join(self.status.silencedBy)}"
        if self.status.inhibitedBy:
            return f"inhibited by {', '.join(self.status.inhibitedBy)}"
        return self.status.state


_LIST = TypeAdapter(Annotated[list[dict], Field(max_length=MAX_ALERTS)])


class PullFailed(Exception):
    """Alertmanager did not answer with a list of alerts; the reason is one line."""


def check_node(name: str) -> str:
    if not NODE.fullmatch(name):
        raise UsageError(f"--node {name[:80]!r}: expected a node name (letters, digits, '.', '_', '-')")
    return name


def check_url(url: str) -> str:
    """Alertmanager's base URL: http(s), a host, no query, fragment or credentials in it."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError as e:
        raise UsageError(f"--alertmanager {url[:200]}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--alertmanager {url[:200]}: expected http://HOST:PORT or https://HOST:PORT")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise UsageError(f"--alertmanager {url[:200]}: no query, fragment or credentials in it")
    return url.rstrip("/")


def alerts_url(base: str, node: str) -> str:
    """All active alerts of this node, silenced and inhibited ones included so the record can say
    why an alert taken earlier stopped being active; only `active` ones are taken."""
    matcher = f'{NODE_LABEL}="{node}"'  # check_node admits no quote or backslash: nothing to escape
    query = {"active": "true", "silenced": "true", "inhibited": "true", "unprocessed": "true"}
    # the shipped rules mark alerts that name no target memdiag_target="none": they stay with people
    filters = [matcher, 'memdiag_target!="none"']
    return f"{base}/api/v2/alerts?{urlencode(query)}&" + urlencode([("filter", f) for f in filters])


def fetch(url: str, token: str | None, timeout: float = TIMEOUT_S) -> tuple[list[PulledAlert], list[str]]:
    """The alerts at url and a line per alert that is not one memdiag can take (too many labels,
    a wrong type: the others are taken all the same), or PullFailed with the reason."""
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (scheme checked: check_url)
            body = r.read(MAX_RESPONSE + 1)
    except urllib.error.HTTPError as e:
        raise PullFailed(f"HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        raise PullFailed(f"cannot connect ({getattr(e.reason, 'strerror', None) or e.reason})") from None
    except (TimeoutError, OSError) as e:
        raise PullFailed(f"no answer within {timeout:g} s" if isinstance(e, TimeoutError) else str(e)) from None
    if len(body) > MAX_RESPONSE:
        raise PullFailed(f"answer larger than {MAX_RESPONSE} bytes")
    try:
        value = from_json(body, allow_inf_nan=False)
    except ValueError as e:
        raise PullFailed(f"not JSON: {e}"[:300]) from None
    try:
        items = _LIST.validate_python(value)
    except ValidationError as e:
        raise PullFailed(f"not a list of alerts: {e.errors()[0]['msg']}"[:300]) from None
    alerts, bad = [], []
    for item in items:
        try:
            alerts.append(PulledAlert.model_validate(item))
        except ValidationError as e:
            where = ".".join(str(p)[:64] for p in e.errors()[0]["loc"])
            fingerprint = str(item.get("fingerprint", "?"))[:32]
            bad.append(f"alert {fingerprint} not taken: {where}: {e.errors()[0]['msg']}"[:300])
    return alerts, bad


def _log(line: str) -> None:
    print(f"memdiag serve: {line}", file=sys.stderr, flush=True)


class Poller:
    """Polls in a thread of its own. take: app.take_alerts bound to the server's store, worker and
    metrics (source "alertmanager", so a pulled alert and its webhook are one incident)."""

    def __init__(
        self,
        base: str,
        node: str,
        token: str | None,
        interval: float,
        take: Callable[..., list[dict]],
        log: Callable[[str], None] = _log,
    ):
        self.base, self.url, self.token, self.interval = base, alerts_url(base, node), token, interval
        self.take, self.log, self.timeout = take, log, TIMEOUT_S
        self.taken: dict[str, PulledAlert] = {}  # fingerprint|startsAt -> the alert, while it is active
        self.refused: dict[str, str] = {}  # fingerprint|startsAt -> why it was not taken (said once)
        self.bad: set[str] = set()  # alerts not in a shape memdiag takes, as logged
        self.failures, self.reason, self.since = 0, "", 0.0
        self.thread = threading.Thread(target=self._loop, name="memdiag-pull", daemon=True)

    def start(self) -> Poller:
        self.thread.start()
        return self

    def health(self) -> str | None:
        if not self.thread.is_alive():
            return "the Alertmanager poller has stopped"
        if self.failures < FAILURES_UNHEALTHY:
            return None
        return (
            f"Alertmanager {self.base} failing: {self.reason} ({self.failures} polls in a row, "
            f"for {time.monotonic() - self.since:.0f} s)"
        )

    def delay(self) -> float:
        """The wait before the next poll: --poll, doubled per failure in a row up to MAX_BACKOFF_S."""
        if not self.failures:
            return self.interval
        return min(self.interval * 2 ** min(self.failures, 16), max(self.interval, MAX_BACKOFF_S))

    def _loop(self) -> None:
        while True:
            self.poll_once()
            time.sleep(self.delay())

    def poll_once(self) -> None:
        try:
            alerts, bad = fetch(self.url, self.token, self.timeout)
        except PullFailed as e:
            self._failed(str(e))
            return
        except Exception as e:  # noqa: BLE001 (the poller never dies; the reason is reported)
            self._failed(f"{type(e).__name__}: {e}")
            return
        if self.failures:
            self.log(f"Alertmanager {self.base} answers again after {self.failures} failed polls")
        self.failures = 0
        for line in set(bad) - self.bad:
            self.log(line)
        self.bad = set(bad)  # each said once while Alertmanager lists it
        try:
            self._handle(alerts)
        except Exception as e:  # noqa: BLE001
            self.log(f"Alertmanager poll: {type(e).__name__}: {e}")

    def _failed(self, reason: str) -> None:
        if not self.failures:
            self.since = time.monotonic()
            self.log(f"Alertmanager {self.base} failing: {reason}; polling with back-off")
        self.failures += 1
        self.reason = reason

    def _handle(self, alerts: list[PulledAlert]) -> None:
        active = {f"{a.fingerprint}|{a.startsAt}": a for a in alerts if a.status.state == "active"}
        everything = {a.fingerprint: a for a in alerts}
        for key, alert in active.items():
            if key not in self.taken and key not in self.refused:
                self._take(key, alert)
        for key in [k for k in self.taken if k not in active]:
            self._gone(self.taken.pop(key), everything.get(key.split("|", 1)[0]))
        for key in [k for k in self.refused if k not in active]:
            del self.refused[key]  # the same alert firing again later is looked at again

    def _take(self, key: str, alert: PulledAlert) -> None:
        try:
            self.take([alert.as_alert()])
        except Refused as e:
            if e.status in (429, 503):  # queue full or storage failing: taken at a later poll
                return
            self.refused[key] = e.reason
            self.log(f"alert {alert.fingerprint} ({alert.labels.get('alertname', '?')}) not taken: {e.reason}")
            return
        self.taken[key] = alert

    def _gone(self, alert: PulledAlert, now: PulledAlert | None) -> None:
        said = f"now {now.said()}" if now is not None else "no longer listed (resolved or expired)"
        gone = alert.as_alert().model_copy(update={"status": "resolved", "endsAt": alert.endsAt})
        summary = (
            f"alert no longer active in Alertmanager ({said}): recorded, not diagnosed; "
            "a diagnosis already under way continues"
        )
        try:
            self.take([gone], resolved_summary=summary)
        except Refused as e:
            self.log(f"alert {alert.fingerprint}: {summary}, but not recorded: {e.reason}")
