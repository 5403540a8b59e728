"""Verdicts pushed out (`memdiag serve --notify FILE`): each incident whose diagnosis ends `done` is
posted, with its verdict line, its culprit, its id and a link to its report, to every destination
the file names, through apprise (Slack, Teams, PagerDuty, email, ntfy, a generic JSON webhook...).

The file holds secrets (a webhook URL carries its token): it is read under the token files' rules
(security.read_owner_only) and no URL is ever shown whole. Logs and incidents name a destination
by apprise's own privacy form with every path segment shortened too, and an error apprise reports
is scrubbed of every part of the URL that form does not show.

Delivery never touches the diagnosis: the worker stores the outcome with the delivery `pending`
in the same write, and tells the notifier, whose own thread sends. A destination that fails is
tried again after a backoff that doubles (--notify-backoff, --notify-attempts); one that took the
message is not sent it again. The state is kept on the incident (Store.note), so a restarted serve
delivers what was pending and never re-sends what was delivered (a send cut off by the stop itself
is sent again: delivery is at least once)."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

from ..errors import UsageError
from .security import read_owner_only
from .store import Incident, Store

MAX_FILE = 64 << 10  # the --notify file: a few dozen URLs of a few hundred bytes each
MAX_DESTINATIONS = 32
MAX_URL = 4096
MAX_ERROR = 300  # characters of an error kept on the incident
MAX_SUMMARY = 1500  # characters of the verdict line sent (a chat message, not the report)
DEFAULT_ATTEMPTS, MAX_ATTEMPTS = 6, 20
DEFAULT_BACKOFF_S, MAX_BACKOFF_S = 5.0, 600.0  # first wait; the doubling stops at the cap
UNSENT = ("pending", "retrying")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]{0,31})://")
_PIECES = re.compile(r"[/:@?&=#,;+\s]+")
# apprise's notify_type per verdict kind: the colour or priority a service gives the message
KINDS = {
    "leak": "failure",
    "oom": "failure",
    "growth": "warning",
    "pressure": "warning",
    "cache": "info",
    "inconclusive": "info",
    "healthy": "success",
}


@dataclass(frozen=True)
class Destination:
    """One URL of the --notify file: apprise's plugin for it (which holds the secret), the form it
    is shown in, and the parts of the URL that form hides (scrubbed from any error text)."""

    shown: str
    plugin: Any
    secrets: tuple[str, ...]

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


def _short(segment: str) -> str:
    """A path segment as shown: apprise's own mask kept, anything longer than two characters cut
    to its first and last (a webhook's path is often its token)."""
    if len(segment) <= 2 or "..." in segment or set(segment) <= {"*"}:
        return segment
    return f"{segment[0]}...{segment[-1]}"


def shown_form(private: str) -> str:
    """apprise's privacy form of a URL, without its query (headers and options can be tokens:
    json://...?-X-Token=...) and with its path segments shortened."""
    parts = urlsplit(private)
    path = "/".join(_short(s) for s in parts.path.rstrip("/").split("/"))
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def _secrets(url: str, shown: str) -> tuple[str, ...]:
    """The pieces of a URL that its shown form does not show (nor its scheme), longest first."""
    visible = set(_PIECES.split(unquote(shown))) | set(_PIECES.split(shown)) | {url.partition("://")[0]}
    pieces = set(_PIECES.split(url)) | set(_PIECES.split(unquote(url)))
    return tuple(sorted((p for p in pieces if len(p) >= 4 and p not in visible), key=len, reverse=True))


class _Said(logging.Handler):
    """What apprise logs at warning and above while one send runs (its only account of why a send
    failed). apprise's logger stops here: its records never reach serve's log unscrubbed."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # noqa: BLE001 (a malformed record says nothing worth a failure)
            self.lines.append(record.msg if isinstance(record.msg, str) else "apprise logged an error")


_SAID = _Said()
_APPRISE: Any = None


def _apprise():
    """apprise, imported only when serve notifies (its first URL loads every plugin: tens of MiB),
    with its logger routed to _SAID."""
    global _APPRISE
    if _APPRISE is None:
        import apprise

        log = logging.getLogger("apprise")
        log.propagate = False
        log.setLevel(logging.WARNING)
        log.addHandler(_SAID)
        _APPRISE = apprise
    return _APPRISE


def _asset():
    # synchronous (the notifier's own thread is the one that waits), nothing persisted on disk
    return _apprise().AppriseAsset(app_id="memdiag", app_desc="memdiag serve", async_mode=False, storage_mode="memory")


def destination(url: str) -> Destination:
    """apprise's plugin for a URL and its shown form; ValueError (already scrubbed) if apprise
    cannot send to it."""
    apprise = _apprise()
    del _SAID.lines[:]
    plugin = apprise.Apprise.instantiate(url, asset=_asset(), suppress_exceptions=True)
    if plugin is None:
        why = _SAID.lines[-1] if _SAID.lines else "apprise knows no service by that scheme"
        raise ValueError(Destination("", None, _secrets(url, "")).scrub(why)[:MAX_ERROR])
    shown = shown_form(plugin.url(privacy=True))
    return Destination(shown, plugin, _secrets(url, shown))


def parse_urls(raw: bytes, where: str) -> list[tuple[str, str]]:
    """(place, URL) for each URL of a --notify file: one URL a line (# comments, blank lines), or a
    YAML list of strings. UsageError naming the line, never the URL (it holds a secret)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where}: not UTF-8 text") from None
    lines = [(n, line.strip()) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not lines:
        raise UsageError(f"{where}: no URL in it (one apprise URL a line, or a YAML list of them)")
    yaml_list = lines[0][1].startswith("-")
    urls = _yaml_list(text, where) if yaml_list else [(f"line {n}", line) for n, line in lines]
    if len(urls) > MAX_DESTINATIONS:
        raise UsageError(f"{where}: {len(urls)} URLs, at most {MAX_DESTINATIONS}")
    for place, url in urls:
        if len(url) > MAX_URL:
            raise UsageError(f"{where}: {place}: a URL longer than {MAX_URL} characters")
        if any(c.isspace() or unicodedata.category(c) in ("Cc", "Cf") for c in url):
            raise UsageError(f"{where}: {place}: a URL has no spaces or control characters")
        if not _SCHEME.match(url):
            raise UsageError(f"{where}: {place}: not a URL (expected SCHEME://..., e.g. slack://, json://)")
    return urls


def _yaml_list(text: str, where: str) -> list[tuple[str, str]]:
    import yaml

    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as e:  # its text quotes the file: only the line is said
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{where}: not a YAML list of URLs (malformed{at})") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UsageError(f"{where}: a YAML --notify file is a list of URLs, each a string")
    return [(f"item {i}", v.strip()) for i, v in enumerate(value, 1)]


def load(path: Path) -> list[Destination]:
    """The destinations of a --notify file, each checked by apprise at start: UsageError (one line)
    for a file that is not safe, not readable as URLs, or names a URL apprise cannot send to."""
    where = f"--notify {path}"
    raw = read_owner_only(path, "--notify", MAX_FILE)
    out: list[Destination] = []
    for place, url in parse_urls(raw, where):
        scheme = _SCHEME.match(url).group(1).lower()  # type: ignore[union-attr]
        try:
            d = destination(url)
        except ValueError as e:
            raise UsageError(f"{where}: {place}: apprise cannot send to this {scheme}:// URL ({e})") from None
        taken = sum(o.shown == d.shown or o.shown.startswith(d.shown + " #") for o in out)
        out.append(Destination(f"{d.shown} #{taken + 1}", d.plugin, d.secrets) if taken else d)
    return out


def check_public_url(text: str) -> str:
    """--public-url: where people reach serve (the links notifications carry), without a trailing /."""
    parts = urlsplit(text)
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.username is not None
        or parts.query
        or parts.fragment
        or len(text) > 512
        or not all(0x21 <= ord(c) <= 0x7E for c in text)
    ):
        raise UsageError(f"--public-url {text[:100]}: expected http(s)://HOST[:PORT][/PATH], no query or credentials")
    return text.rstrip("/")


def _clean(text: str, limit: int) -> str:
    """A target's or a sender's string as a message line: control and format characters (a bidi
    override in a comm) as spaces, cut to `limit` characters."""
    out = "".join(" " if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in text)
    return out if len(out) <= limit else out[: limit - 1] + "…"


def message(incident: Incident, public_url: str) -> tuple[str, str, str]:
    """(title, body, apprise notify type) of a done incident."""
    target = (incident.target or {}).get("description") or "the target"
    kind = incident.verdict_kind or "unknown"
    labels = (incident.alert or {}).get("labels")
    alertname = labels.get("alertname") if isinstance(labels, dict) else None
    origin = incident.source + (f" alert {_clean(str(alertname), 200)}" if alertname else "")
    culprit = _clean(incident.culprit, 500) if incident.culprit else "none named"
    body = "\n".join(
        (
            _clean(incident.summary or "", MAX_SUMMARY),
            f"Culprit: {culprit}",
            f"Incident: {incident.id} ({origin})",
            f"Report: {public_url}/incidents/{incident.id}?format=html",
        )
    )
    return _clean(f"memdiag: {kind} — {target}", 250), body, KINDS.get(kind, "info")


def send(d: Destination, title: str, body: str, kind: str) -> str | None:
    """One message to one destination through apprise: None once sent, else why not (scrubbed)."""
    apprise = _apprise()
    a = apprise.Apprise(asset=_asset())
    a.add(d.plugin)
    del _SAID.lines[:]
    try:
        ok = a.notify(body=body, title=title, notify_type=kind, body_format=apprise.NotifyFormat.TEXT)
    except Exception as e:  # noqa: BLE001 (a plugin's bug is a failed send, never a dead notifier)
        ok = False
        _SAID.lines.append(f"{type(e).__name__}: {e}")
    if ok:
        return None
    why = _SAID.lines[-1] if _SAID.lines else "apprise reported the message not sent"
    return _clean(d.scrub(why), MAX_ERROR)


def backoff(attempts: int, first_s: float) -> float:
    """Seconds before the next try after `attempts` failed ones: first_s, doubling, capped."""
    return min(first_s * 2 ** (attempts - 1), MAX_BACKOFF_S)


def summary(entries: list[dict]) -> dict:
    """The incident's notify state from its destinations': retrying while one has tries left,
    failed once one has none, delivered when all took it."""
    states = {e["state"] for e in entries}
    state = "retrying" if states & set(UNSENT) else "failed" if "failed" in states else "delivered"
    errors = [e["error"] for e in entries if e.get("error") and e["state"] != "delivered"]
    return {
        "state": state,
        "attempts": max((e["attempts"] for e in entries), default=0),
        "error": errors[-1] if errors else None,
        "destinations": entries,
    }


class Notifier:
    """Delivers done incidents on its own thread (start) or as a test drives it (step)."""

    def __init__(
        self,
        store: Store,
        destinations: list[Destination],
        public_url: str,
        attempts: int = DEFAULT_ATTEMPTS,
        backoff_s: float = DEFAULT_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sender: Callable[[Destination, str, str, str], str | None] = send,
        on_outcome: Callable[[str], None] = lambda outcome: None,
    ):
        self.store, self.destinations, self.public_url = store, destinations, public_url.rstrip("/")
        self.attempts, self.backoff_s = attempts, backoff_s
        self.clock, self.wall, self.sender = clock, wall, sender
        self.on_outcome = on_outcome  # per send: delivered, retried or failed (serve's /metrics counts them)
        self._due: dict[str, float] = {}  # incident -> clock time of its next delivery
        self._ready = threading.Condition()
        self.thread: threading.Thread | None = None

    def pending(self) -> dict:
        """The notify state a done incident is stored with: nothing tried yet."""
        entries = [{"to": d.shown, "state": "pending", "attempts": 0, "error": None} for d in self.destinations]
        return {**summary(entries), "state": "pending"}

    def finished(self, iid: str) -> None:
        """A done incident to deliver (the worker's call: it only queues, it never waits)."""
        with self._ready:
            self._due[iid] = self.clock()
            self._ready.notify()

    def resume(self) -> int:
        """What a stop left undelivered, queued again; how many incidents."""
        left = self.store.unnotified()
        for iid in left:
            self.finished(iid)
        return len(left)

    def start(self) -> Notifier:
        self.thread = threading.Thread(target=self._loop, name="memdiag-notify", daemon=True)
        self.thread.start()
        return self

    def queued(self) -> int:
        return len(self._due)

    def _loop(self) -> None:
        while True:
            with self._ready:
                while True:
                    nxt = min(self._due.values(), default=None)
                    if nxt is not None and nxt <= self.clock():
                        break
                    self._ready.wait(None if nxt is None else nxt - self.clock())
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 (the notifier outlives its own bugs; the incident is kept)
                print(f"memdiag serve: notifier: {type(e).__name__}: {e}", file=sys.stderr, flush=True)

    def step(self) -> float | None:
        """Deliver every incident whose time has come; the clock time of the next (None: none)."""
        now = self.clock()
        with self._ready:
            due = sorted((t, i) for i, t in self._due.items() if t <= now)
            for _, iid in due:
                del self._due[iid]
        for _, iid in due:
            self._deliver(iid)
        with self._ready:
            return min(self._due.values(), default=None)

    def _entries(self, notify: dict) -> list[dict]:
        """The incident's per-destination state against the destinations configured now (the file
        may have changed across a restart): a new one is pending, one gone is failed if unsent."""
        kept = {e.get("to"): dict(e) for e in notify.get("destinations") or [] if isinstance(e, dict)}
        entries = [
            kept.pop(d.shown, None) or {"to": d.shown, "state": "pending", "attempts": 0, "error": None}
            for d in self.destinations
        ]
        for gone in kept.values():
            if gone.get("state") in UNSENT:
                gone.update(state="failed", error="no longer in the --notify file")
            entries.append(gone)
        return entries

    def _deliver(self, iid: str) -> None:
        incident = self.store.get(iid)
        if incident is None or incident.state != "done" or (incident.notify or {}).get("state") not in UNSENT:
            return  # evicted, diagnosed again since, or already settled
        entries = self._entries(incident.notify or {})
        title, body, kind = message(incident, self.public_url)
        by_shown = {d.shown: d for d in self.destinations}
        for entry in entries:
            d = by_shown.get(entry["to"])
            if d is None or entry["state"] not in UNSENT:
                continue
            error = self.sender(d, title, body, kind)
            entry["attempts"] += 1
            entry["last_attempt"] = self.wall()
            self._record(iid, d, entry, error)
        state = summary(entries)
        if state["state"] == "retrying":
            tries = min(e["attempts"] for e in entries if e["state"] in UNSENT)
            wait = backoff(tries, self.backoff_s)
            state["next_attempt"] = self.wall() + wait
            with self._ready:
                self._due[iid] = self.clock() + wait
        again = self.store.get(iid)
        if again is not None and again.updated == incident.updated:  # not diagnosed again meanwhile
            self.store.note(iid, state)

    def _record(self, iid: str, d: Destination, entry: dict, error: str | None) -> None:
        n = entry["attempts"]
        if error is None:
            entry.update(state="delivered", error=None)
            self.on_outcome("delivered")
            print(f"memdiag serve: incident {iid}: verdict delivered to {d.shown} (attempt {n})", flush=True)
            return
        entry["error"] = error
        if n >= self.attempts:
            entry["state"] = "failed"
            then = "not tried again"
        else:
            entry["state"] = "retrying"
            then = f"again in {backoff(n, self.backoff_s):g} s"
        self.on_outcome(entry["state"].replace("retrying", "retried"))
        print(
            f"memdiag serve: incident {iid}: notifying {d.shown}: attempt {n} of {self.attempts} failed ({error}); "
            + then,
            file=sys.stderr,
            flush=True,
        )
