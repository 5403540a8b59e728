"""serve's notifier without a server (diagnose/serve/notify.py): the --notify file read under the
token files' rules, URLs never shown whole, and delivery to a real local webhook receiver through
apprise, driven step by step on an injected clock: retried with a doubling backoff, failed after
its attempts, its state on the incident, and a restart that sends what was left and only that."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest
from kit import MEMDIAG
from memdiag.diagnose.errors import UsageError
from memdiag.diagnose.serve import notify
from memdiag.diagnose.serve.store import Store
from webhook import Receiver

SLACK = "https://hooks.slack.com/services/T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ"
TOKEN = "S3cretHookToken"


def _file(tmp_path, text: str, mode: int = 0o600, name: str = "notify"):
    path = tmp_path / name
    path.write_text(text)
    path.chmod(mode)
    return path


def _refused(path, match: str) -> str:
    with pytest.raises(UsageError, match=match) as e:
        notify.load(path)
    return str(e.value)


def test_the_notify_file_is_refused_as_a_token_file_would_be(tmp_path):
    ok = f"json://127.0.0.1:9/hook-{TOKEN}\n"
    _refused(_file(tmp_path, ok, 0o644, "loose"), r"readable or writable by others \(mode 644\): run chmod 600")
    _refused(_file(tmp_path, ok, 0o620, "group-writable"), r"mode 620")
    _refused(_file(tmp_path, ok, 0o604, "world-readable"), r"mode 604")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    _refused(fifo, "not a regular file")  # opened without blocking: a FIFO does not hang the start
    _refused(tmp_path, "not a regular file")
    _refused(tmp_path / "missing", r"cannot read \(No such file or directory\)")
    _refused(_file(tmp_path, ok * 2000, name="long"), f"longer than {notify.MAX_FILE} bytes")


def test_a_notify_file_of_urls_or_a_yaml_list_is_read_and_its_mistakes_named_by_line(tmp_path):
    lines = _file(tmp_path, f"# on-call\n\njson://127.0.0.1:9/hook-{TOKEN}\n  {SLACK}  \n")
    assert [d.shown for d in notify.load(lines)] == ["json://127.0.0.1:9/h...n", "slack://T...2/A...D/T...Q"]
    listed = _file(tmp_path, f"# on-call\n- json://127.0.0.1:9/hook-{TOKEN}\n- {SLACK}\n", name="yaml")
    assert [d.shown for d in notify.load(listed)] == ["json://127.0.0.1:9/h...n", "slack://T...2/A...D/T...Q"]
    same = _file(tmp_path, f"json://127.0.0.1:9/hook-{TOKEN}\njson://127.0.0.1:9/hook-{TOKEN}x\n", name="same")
    assert [d.shown for d in notify.load(same)] == ["json://127.0.0.1:9/h...n", "json://127.0.0.1:9/h...x"]
    cases = [
        ("# nothing\n\n", "no URL in it"),
        (b"\xff\xfe json://x", "not UTF-8 text"),
        (f"json://127.0.0.1:9/a\nhooks.example.com/{TOKEN}\n", r"line 2: not a URL \(expected SCHEME://"),
        (f"bogus://{TOKEN}@example.com\n", r"line 1: apprise cannot send to this bogus:// URL"),
        (f"slack://{TOKEN}\n", r"line 1: apprise cannot send to this slack:// URL"),
        (f"- json://127.0.0.1:9/a\n- [{TOKEN}\n", r"not a YAML list of URLs \(malformed at line 3\)"),
        (f"- json://127.0.0.1:9/a\n- {{token: {TOKEN}}}\n", "a YAML --notify file is a list of URLs, each a string"),
        (f"json://127.0.0.1:9/{TOKEN}\u202e\n", "line 1: a URL has no spaces or control characters"),
        ("".join(f"json://127.0.0.1:9/{i}\n" for i in range(40)), "40 URLs, at most 32"),
    ]
    for i, (text, match) in enumerate(cases):
        path = tmp_path / f"case-{i}"
        (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
        path.chmod(0o600)
        said = _refused(path, match)
        assert TOKEN not in said and "\n" not in said, said  # a URL's secret is never quoted


def test_serve_refuses_a_bad_notify_file_at_start_in_one_line(tmp_path):
    loose = _file(tmp_path, f"json://127.0.0.1:9/hook-{TOKEN}\n", 0o644)
    base = [MEMDIAG, "serve", "--no-oom-watch", "--data", str(tmp_path / "data"), "--listen", "127.0.0.1:9"]
    cases = [
        (["--notify", str(loose)], f"memdiag: --notify {loose}: readable or writable by others (mode 644)"),
        (["--public-url", "http://x"], "memdiag: --public-url is the link notifications carry: it needs --notify"),
        (["--notify", str(loose), "--notify-attempts", "0"], "--notify-attempts: '0' is not a whole number"),
    ]
    loose_ok = _file(tmp_path, f"json://127.0.0.1:9/hook-{TOKEN}\n", name="ok")
    cases.append((["--notify", str(loose_ok), "--public-url", "ftp://x"], "--public-url ftp://x: expected http(s)"))
    for extra, expected in cases:
        r = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stderr.strip().splitlines() == [r.stderr.strip()], (extra, r.stderr)
        assert r.stderr.startswith(expected) if expected.startswith("memdiag") else expected in r.stderr, r.stderr
        assert "listening on" not in r.stdout and TOKEN not in r.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was made


def test_shown_forms_and_errors_carry_no_part_of_a_secret():
    for url, secrets in [
        (SLACK, ["T1JJ3T3L2", "A1BRTD4JD", "TIiajkdnlazkcOXrIdevi7FQ"]),
        ("pagerduty://integrationKey123@apiKey456/src/comp", ["integrationKey123", "apiKey456"]),
        (f"jsons://user:pa55word@hooks.example.com/path/{TOKEN}?+X-Token=hdr{TOKEN}", ["pa55word", TOKEN]),
        ("mailtos://oncall:hunter22@example.com?to=pager@example.com", ["hunter22"]),
    ]:
        d = notify.destination(url)
        assert not [s for s in secrets if s in d.shown], d.shown
        said = d.scrub(f"could not post to {url}: refused {secrets[-1]}")
        assert not [s for s in secrets if s in said], said


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data")
    yield s
    s.close()


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _done(store: Store, notifier: notify.Notifier, culprit: str = "leak_order_history") -> str:
    """An incident settled done as the worker settles it, and handed to the notifier."""
    target = {"kind": "pid", "pid": 4242, "comm": "orderd", "description": "PID 4242 (orderd)"}
    alert = {"labels": {"alertname": "MemoryGrowth", "pid": "4242"}}
    incident, _ = store.admit("alertmanager", target, alert, None)
    store.start(incident.id)
    store.settle(
        incident.id,
        state="done",
        verdict_kind="leak",
        summary=f"leak: 12.0 MiB outstanding from {culprit} over 30 s",
        culprit=culprit,
        notify=notifier.pending(),
    )
    notifier.finished(incident.id)
    return incident.id


def test_a_receiver_failing_twice_gets_the_verdict_on_the_third_attempt_after_a_doubling_backoff(store):
    clock = Clock()
    with Receiver([500, 500, 200]) as rx:
        d = notify.destination(rx.url(f"/hook-{TOKEN}"))
        n = notify.Notifier(store, [d], "https://memdiag.example/", attempts=5, backoff_s=2.0, clock=clock)
        iid = _done(store, n)
        assert store.get(iid).notify["state"] == "pending"
        assert n.step() == 1002.0  # attempt 1 failed: again in 2 s
        state = store.get(iid).notify
        assert (state["state"], state["attempts"]) == ("retrying", 1) and "error=500" in state["error"]
        clock.now = 1001.9
        assert n.step() == 1002.0 and len(rx.received) == 1  # not yet
        clock.now = 1002.0
        assert n.step() == 1006.0  # attempt 2 failed: again in 4 s
        clock.now = 1006.0
        assert n.step() is None
        posts = rx.wait(3)
    state = store.get(iid).notify
    assert state["state"] == "delivered" and state["attempts"] == 3 and state["error"] is None
    (entry,) = state["destinations"]
    assert abs(entry.pop("last_attempt") - time.time()) < 60  # when the third attempt was made, wall time
    assert entry == {"to": d.shown, "state": "delivered", "attempts": 3, "error": None}
    body = posts[-1]["body"]
    assert body["type"] == "failure" and body["title"] == "memdiag: leak — PID 4242 (orderd)"
    assert body["message"].splitlines() == [
        "leak: 12.0 MiB outstanding from leak_order_history over 30 s",
        "Culprit: leak_order_history",
        f"Incident: {iid} (alertmanager alert MemoryGrowth)",
        f"Report: https://memdiag.example/incidents/{iid}?format=html",
    ]
    assert TOKEN not in json.dumps(store.get(iid).model_dump())


def test_a_receiver_that_always_fails_leaves_the_incident_done_and_its_delivery_failed(store):
    clock = Clock()
    with Receiver([503]) as rx:
        n = notify.Notifier(store, [notify.destination(rx.url())], "http://h:1", attempts=3, backoff_s=1.0, clock=clock)
        iid = _done(store, n)
        while (due := n.step()) is not None:
            clock.now = due
        rx.wait(3)
    incident = store.get(iid)
    assert incident.state == "done" and incident.verdict_kind == "leak"
    assert incident.notify["state"] == "failed" and incident.notify["attempts"] == 3
    assert "error=503" in incident.notify["error"] and len(rx.received) == 3


def test_a_restart_sends_what_was_left_and_never_what_was_delivered(tmp_path):
    clock = Clock()
    with Receiver([200]) as ok, Receiver([500, 200]) as flaky:
        dests = [notify.destination(ok.url()), notify.destination(flaky.url())]
        store = Store(tmp_path / "data")
        n = notify.Notifier(store, dests, "http://h:1", backoff_s=60.0, clock=clock)
        iid = _done(store, n)
        n.step()  # the first took it, the second failed: retrying in 60 s when serve stops
        assert [e["state"] for e in store.get(iid).notify["destinations"]] == ["delivered", "retrying"]
        store.close()
        store = Store(tmp_path / "data")  # serve started again on the same folder
        again = notify.Notifier(store, dests, "http://h:1", backoff_s=60.0, clock=clock)
        assert again.resume() == 1
        assert again.step() is None
        state = store.get(iid).notify
        store.close()
    assert state["state"] == "delivered" and [e["attempts"] for e in state["destinations"]] == [1, 2]
    assert len(ok.received) == 1 and len(flaky.received) == 2


def test_a_destination_dropped_from_the_file_across_a_restart_is_failed_not_retried(tmp_path):
    clock = Clock()
    with Receiver([500]) as gone, Receiver([200]) as kept:
        store = Store(tmp_path / "data")
        first = notify.Notifier(store, [notify.destination(gone.url())], "http://h:1", clock=clock)
        iid = _done(store, first)
        first.step()
        store.close()
        store = Store(tmp_path / "data")
        second = notify.Notifier(store, [notify.destination(kept.url())], "http://h:1", clock=clock)
        second.resume()
        second.step()
        state = store.get(iid).notify
        store.close()
    assert [(e["state"], e["error"]) for e in state["destinations"]] == [
        ("delivered", None),
        ("failed", "no longer in the --notify file"),
    ]
    assert state["state"] == "failed" and len(gone.received) == 1 and len(kept.received) == 1
