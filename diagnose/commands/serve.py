"""Long-running agent: ``memdiag serve [--listen ADDR:PORT] [--token-file F] [--data DIR]`` turns
alerts (Alertmanager, Grafana, plain JSON) into diagnoses and records every OOM kill."""

from __future__ import annotations

import argparse
import gc
import ipaddress
import os
import signal
import socket
from pathlib import Path

from ..errors import PermissionNeeded, SignalInterrupted, UsageError
from ..options import PERCENT, add_playbook_option, number
from ..workflow import DEFAULT_BUDGET_PERCENT, load_book

MAX_QUEUE = 10_000
MAX_DURATION = 3600.0
BACKLOG = 256  # connections the kernel holds before accept; each costs no descriptor of ours
MAX_SECRET = 4096


_DURATION = number(0, MAX_DURATION, above=True, unit="seconds")
_QUEUE = number(1, MAX_QUEUE, integer=True)
_INCIDENTS = number(1, 1_000_000, integer=True)  # a row is at most ~64 KiB: 1M rows is already 64 GiB
_REPORT_MB = number(1, 1 << 20, integer=True)  # 1 TiB
_WINDOW = number(0, 365 * 86_400, above=True, unit="seconds")
_ATTEMPTS = number(1, 100, integer=True)
_RECORD = number(0.5, 600, unit="seconds")
_POLL = number(1, 3600, unit="seconds")  # Alertmanager evaluates every few seconds: faster buys nothing


SUMMARY = "long-running agent: turn alerts into diagnoses and record every OOM kill"
EPILOG = """\
Alerts arrive as webhooks (POST /alerts/alertmanager, /alerts/grafana, plain
JSON on /diagnose) or are pulled from Alertmanager with --node and
--alertmanager; GET /incidents lists the incidents.

examples:
  memdiag serve
  memdiag serve --listen 0.0.0.0:9797 --token-file /etc/memdiag/token
  memdiag serve --node "$(hostname)" --alertmanager http://alertmanager:9093
  memdiag serve --notify /etc/memdiag/notify.yaml --public-url http://HOST:9797

exit status:
  0  stopped cleanly    1  a failure
  2  bad usage (a bad option, a port in use, an unsafe data folder)
  130, 143  stopped by SIGINT, SIGTERM (queued diagnoses resume at next start)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--listen", default="127.0.0.1:9797", metavar="ADDR:PORT", help="where to listen (default 127.0.0.1:9797)"
    )
    parser.add_argument(
        "--token-file", type=Path, metavar="F", help="bearer token every POST must carry (required off loopback)"
    )
    parser.add_argument(
        "--read-token-file",
        type=Path,
        metavar="F",
        help="bearer token that GET /incidents and /metrics must carry (the POST token also works); "
        "without it reads are open (/healthz always is)",
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=Path("/var/lib/memdiag/serve"),
        metavar="DIR",
        help="incidents database and reports (default /var/lib/memdiag/serve)",
    )
    parser.add_argument(
        "--duration",
        type=_DURATION,
        default=30.0,
        metavar="DURATION",
        help="window of each diagnosis: 30s, 5m; a plain number is seconds (default 30s, at most 1h)",
    )
    parser.add_argument(
        "--budget",
        type=PERCENT,
        default=DEFAULT_BUDGET_PERCENT,
        metavar="PERCENT",
        help=f"how much each diagnosis may slow its target: 2 or 2%% (default {DEFAULT_BUDGET_PERCENT:g}%%)",
    )
    parser.add_argument(
        "--queue",
        type=_QUEUE,
        default=16,
        metavar="N",
        help="diagnoses waiting at most; a group's alerts beyond it are answered 429, taken when delivered again",
    )
    parser.add_argument(
        "--grafana-secret-file",
        type=Path,
        metavar="F",
        help="verify X-Grafana-Alerting-Signature with this HMAC secret",
    )
    parser.add_argument(
        "--grafana-timestamp-header", metavar="NAME", help="the timestamp header Grafana signs with, when configured"
    )
    _add_store_arguments(parser)
    _add_agent_arguments(parser)
    _add_notify_arguments(parser)
    add_playbook_option(parser)


def _add_store_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-incidents",
        type=_INCIDENTS,
        default=10_000,
        metavar="N",
        help="incidents kept at most; the oldest finished ones (and their reports) go first (default 10000)",
    )
    parser.add_argument(
        "--max-report-mb",
        type=_REPORT_MB,
        default=512,
        metavar="MB",
        help="report bytes kept at most, oldest finished incidents evicted first (default 512)",
    )
    parser.add_argument(
        "--dedupe-window",
        type=_WINDOW,
        default=86_400.0,
        metavar="DURATION",
        help="a diagnosed alert delivered again within this long (24h, 90m; a number is seconds) is not diagnosed "
        "again (default 24h, "
        "longer than Alertmanager's default repeat_interval of 4 h)",
    )
    parser.add_argument(
        "--max-attempts",
        type=_ATTEMPTS,
        default=3,
        metavar="N",
        help="diagnoses started per alert (restarts and re-deliveries) before it stays failed (default 3)",
    )
    parser.add_argument("--no-oom-watch", action="store_true", help="do not watch for OOM kills")
    parser.add_argument(
        "--record-every",
        type=_RECORD,
        default=5.0,
        metavar="DURATION",
        help="the flight recorder's cadence: every memory cgroup and its processes sampled this often, the last"
        " hour kept, so that an OOM kill is explained by what grew before it (default 5)",
    )
    parser.add_argument("--no-recorder", action="store_true", help="do not run the flight recorder")


def _add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node",
        metavar="NAME",
        help="node agent mode: pull from --alertmanager the active alerts whose `node` label is NAME "
        "(webhooks are still accepted)",
    )
    parser.add_argument(
        "--alertmanager", metavar="URL", help="Alertmanager to pull this node's alerts from (API v2), with --node"
    )
    parser.add_argument(
        "--alertmanager-token-file", type=Path, metavar="F", help="bearer token for --alertmanager (behind a proxy)"
    )
    parser.add_argument(
        "--poll",
        type=_POLL,
        default=15.0,
        metavar="DURATION",
        help="time between pulls from --alertmanager (default 15s)",
    )


_NOTIFY_ATTEMPTS = number(1, 20, integer=True)
_NOTIFY_BACKOFF = number(0.1, 600, unit="seconds")


def _add_notify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--notify",
        type=Path,
        metavar="FILE",
        help="post each diagnosed incident (verdict, culprit, link to its report) to the apprise URLs in FILE, "
        "one a line or a YAML list (Slack, Teams, PagerDuty, email, a JSON webhook...); FILE is checked as "
        "the token files are (docs/serve-notify.md)",
    )
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="where people reach this server, for the report links notifications carry "
        "(default http://ADDR:PORT of --listen)",
    )
    parser.add_argument(
        "--notify-attempts",
        type=_NOTIFY_ATTEMPTS,
        default=6,
        metavar="N",
        help="tries per destination before its delivery is failed (default 6)",
    )
    parser.add_argument(
        "--notify-backoff",
        type=_NOTIFY_BACKOFF,
        default=5.0,
        metavar="DURATION",
        help="time before the second try (5s, 1m; a number is seconds), doubling after each failed one up to 10m "
        "(default 5s)",
    )


def _notify_options(args: argparse.Namespace) -> tuple[list, str] | None:
    """(destinations, public URL) of --notify, each checked at start; None without it."""
    if args.notify is None:
        if args.public_url is not None:
            raise UsageError("--public-url is the link notifications carry: it needs --notify")
        return None
    from ..serve.notify import check_public_url, load

    public = check_public_url(args.public_url or f"http://{args.listen}")
    return load(args.notify), public


def _secret(path: Path | None, what: str) -> str | None:
    """A token or HMAC secret from a file only its owner (root or this user) can read or change."""
    if path is None:
        return None
    from ..serve.security import read_owner_only

    raw = read_owner_only(path, what, MAX_SECRET)
    value = raw.decode("ascii", "replace").strip()
    if not value:
        raise UsageError(f"{what} {path}: empty")
    if not all(0x21 <= ord(c) <= 0x7E for c in value):
        raise UsageError(f"{what} {path}: only printable ASCII without spaces can be sent in a header")
    return value


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text}: expected ADDR:PORT")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UsageError(f"--listen {text}: {host} is not an IP address") from None
    return host, int(port)


def _loopback(host: str) -> bool:
    return host == "localhost" or ipaddress.ip_address(host).is_loopback


def _bind(host: str, port: int, text: str) -> socket.socket:
    """The listening socket, bound before anything says it listens: a port in use is one line."""
    host = "127.0.0.1" if host == "localhost" else host
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise UsageError(f"--listen {text}: cannot listen there ({e.strerror or e})") from None
    return sock


def _pull_options(args: argparse.Namespace) -> tuple[str, str, str | None] | None:
    """(Alertmanager URL, node, token) of node agent mode, checked; None without it."""
    from ..serve.pull import check_node, check_url

    if (args.node is None) != (args.alertmanager is None):
        raise UsageError("--node and --alertmanager go together (node agent mode)")
    if args.node is None:
        if args.alertmanager_token_file is not None:
            raise UsageError("--alertmanager-token-file needs --alertmanager")
        return None
    token = _secret(args.alertmanager_token_file, "--alertmanager-token-file")
    return check_url(args.alertmanager), check_node(args.node), token


def _start_poller(pull: tuple[str, str, str | None], poll: float, store, worker, metrics):
    from ..serve.app import take_alerts
    from ..serve.pull import Poller

    url, node, token = pull

    def take(alerts, **kw):
        metrics.received.labels(source="alertmanager-pull").inc(sum(a.status == "firing" for a in alerts))
        return take_alerts(store, worker, metrics, "alertmanager", alerts, **kw)

    print(f'memdiag serve: pulling alerts with node="{node}" from {url} every {poll:g} s', flush=True)
    return Poller(url, node, token, poll, take).start()


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM end serve with one line and the shell's status (130, 143). uvicorn catches
    both while it runs, shuts down, puts back the handlers it found (these) and raises the signal
    again: the handler's exception comes out of Server.run to the CLI. Before uvicorn runs, the
    same handler ends the start."""

    def stopped(signum: int, _frame) -> None:
        raise SignalInterrupted(
            signum,
            f"serve stopped by {signal.Signals(signum).name}; diagnoses queued or cut off resume at the next start",
        )

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stopped)


def _open_store(args: argparse.Namespace):
    import sqlite3  # here, not at the top: every command imports this module for its arguments (0.8 MiB resident)

    from ..serve.datadir import DataInUse, UnsafeData
    from ..serve.store import Limits, Store

    limits = Limits(
        max_incidents=args.max_incidents,
        max_report_bytes=args.max_report_mb << 20,
        dedupe_window=args.dedupe_window,
        max_attempts=args.max_attempts,
    )
    try:
        store = Store(args.data, limits)
    except (DataInUse, UnsafeData) as e:
        raise UsageError(str(e)) from None
    except (OSError, sqlite3.Error) as e:
        raise UsageError(f"--data {args.data}: {getattr(e, 'strerror', None) or e}") from None
    if store.resumed:
        print(f"memdiag serve: {len(store.resumed)} diagnoses cut off by the last stop re-queued", flush=True)
    return store


def _worker(args: argparse.Namespace, store, metrics, rules, notifier):
    from ..serve.worker import Worker

    def done(elapsed: float, report) -> None:
        metrics.durations.observe(elapsed)
        if report.overhead.measured_percent is not None:
            metrics.overhead.set(report.overhead.measured_percent)

    return Worker(store, args.duration, args.budget, rules, maxsize=args.queue, on_done=done, notifier=notifier)


def _notifier(args: argparse.Namespace, notify: tuple[list, str] | None, store, metrics):
    """The notifier's thread, started with what the last stop left undelivered; None without --notify."""
    if notify is None:
        return None
    from ..serve.notify import Notifier

    destinations, public = notify
    notifier = Notifier(
        store,
        destinations,
        public,
        attempts=args.notify_attempts,
        backoff_s=args.notify_backoff,
        on_outcome=lambda outcome: metrics.notifications.labels(outcome=outcome).inc(),
    )
    left = notifier.resume()
    shown = ", ".join(d.shown for d in destinations)
    again = f"; {left} undelivered by the last stop sent again" if left else ""
    print(f"memdiag serve: notifying {shown} of each diagnosed incident (links to {public}){again}", flush=True)
    return notifier.start()


def _serve(app, listener: socket.socket) -> None:
    import uvicorn

    from ..serve.connections import bounded_protocol, connection_limit

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        # idle deadline, and a cap on open connections answered as the application answers refusals
        # (connections.py); uvicorn's limit_concurrency is not set: its 503 is plain text
        http=bounded_protocol(connection_limit(BACKLOG)),
        backlog=BACKLOG,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,  # request line and headers
    )
    uvicorn.Server(config).run(sockets=[listener])


def execute(args: argparse.Namespace) -> int:
    from memdiag.rules.loader import RuleFileError

    from ..serve.app import Config, Metrics, create_app
    from ..serve.oomwatch import KillIncidents, OomWatcher
    from ..serve.recorder import Recorder
    from ..serve.security import FailureLimiter

    _stop_on_signals()
    host, port = _listen(args.listen)
    pull = _pull_options(args)
    token = _secret(args.token_file, "--token-file")
    read_token = _secret(args.read_token_file, "--read-token-file")
    grafana_secret = _secret(args.grafana_secret_file, "--grafana-secret-file")
    notify = _notify_options(args)
    if token is None and not _loopback(host):
        raise UsageError(f"--listen {args.listen}: refusing to listen off loopback without --token-file")
    if os.geteuid() != 0:
        raise PermissionNeeded("memdiag serve runs BPF probes: run it as root")
    listener = _bind(host, port, args.listen)
    try:
        rules = load_book(args.playbook)
    except RuleFileError as e:
        raise UsageError(e.usage_text()) from None
    os.umask(0o077)  # everything serve creates is the owner's only
    store = _open_store(args)
    metrics = Metrics(store)
    worker = _worker(args, store, metrics, rules, _notifier(args, notify, store, metrics))
    busy = lambda: worker.current is not None  # noqa: E731 (a fault sample waits for the diagnosis to end)
    recorder = None if args.no_recorder else Recorder(every_s=args.record_every, busy=busy).start()
    kills = KillIncidents(store, worker, metrics.oom_kills.inc, recorder=recorder)
    watcher = None if args.no_oom_watch else OomWatcher(kills)
    cfg = Config(
        oom_watch=watcher,
        recorder=recorder,
        store=store,
        worker=worker,
        token=token,
        read_token=read_token,
        grafana_secret=grafana_secret,
        grafana_timestamp_header=args.grafana_timestamp_header,
        limiter=FailureLimiter(),
    )
    if pull is not None:
        cfg.checks = (_start_poller(pull, args.poll, store, worker, metrics).health,)
    app = create_app(cfg, metrics)
    # what serve built to start (the playbook, the models, the libraries' own tables: hundreds of
    # thousands of objects) lives as long as it does: kept out of the collector's passes, which
    # otherwise walk all of it every few rounds of the recorder and every few requests
    gc.freeze()
    print(f"memdiag serve: listening on http://{args.listen} (data in {args.data})", flush=True)
    _serve(app, listener)
    return 0
