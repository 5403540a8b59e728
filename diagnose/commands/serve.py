"""Long-running agent: ``memdiag serve [--listen ADDR:PORT] [--token-file F] [--data DIR]`` turns
alerts (Alertmanager, Grafana, plain JSON) into diagnoses and records every OOM kill."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sqlite3
import stat
from pathlib import Path

from ..errors import PermissionNeeded, UsageError
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
_POLL = number(1, 3600, unit="seconds")  # Alertmanager evaluates every few seconds: faster buys nothing


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
    parser.add_argument("--duration", type=_DURATION, default=30.0, metavar="S", help="window of each diagnosis")
    parser.add_argument("--budget", type=PERCENT, default=DEFAULT_BUDGET_PERCENT, metavar="PERCENT")
    parser.add_argument("--queue", type=_QUEUE, default=16, metavar="N", help="diagnoses waiting at most (429 beyond)")
    parser.add_argument(
        "--grafana-secret-file",
        type=Path,
        metavar="F",
        help="verify X-Grafana-Alerting-Signature with this HMAC secret",
    )
    parser.add_argument(
        "--grafana-timestamp-header", metavar="NAME", help="the timestamp header Grafana signs with, when configured"
    )
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
        metavar="S",
        help="a diagnosed alert delivered again within this many seconds is not diagnosed again (default 86400, "
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
        "--poll", type=_POLL, default=15.0, metavar="S", help="seconds between pulls from --alertmanager (default 15)"
    )
    add_playbook_option(parser)


def _secret(path: Path | None, what: str) -> str | None:
    """A token or HMAC secret from a file only its owner (root or this user) can read or change."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the start
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path}: not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise UsageError(f"{what} {path}: owned by uid {st.st_uid}, not root or you: run chown root {path}")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise UsageError(f"{what} {path}: readable or writable by others (mode {mode:o}): run chmod 600 {path}")
        raw = os.read(fd, MAX_SECRET + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_SECRET:
        raise UsageError(f"{what} {path}: longer than {MAX_SECRET} bytes")
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


def execute(args: argparse.Namespace) -> int:
    import uvicorn
    from memdiag.rules.loader import RuleFileError

    from ..serve.app import Config, Metrics, create_app
    from ..serve.connections import bounded_protocol, connection_limit
    from ..serve.oomwatch import OomWatcher, describe, incident_key, incident_place
    from ..serve.security import FailureLimiter
    from ..serve.store import DataInUse, Limits, Store, UnsafeData
    from ..serve.targets import NotOnHost, target_from_labels
    from ..serve.worker import QueueFull, Worker

    host, port = _listen(args.listen)
    pull = _pull_options(args)
    token = _secret(args.token_file, "--token-file")
    read_token = _secret(args.read_token_file, "--read-token-file")
    grafana_secret = _secret(args.grafana_secret_file, "--grafana-secret-file")
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
    metrics = Metrics(store)

    def done(elapsed: float, report) -> None:
        metrics.durations.observe(elapsed)
        if report.overhead.measured_percent is not None:
            metrics.overhead.set(report.overhead.measured_percent)

    worker = Worker(store, args.duration, args.budget, rules, maxsize=args.queue, on_done=done)

    def on_kill(e, container) -> None:
        metrics.oom_kills.inc()
        cgroup = e.memcg or e.victim_cgroup
        target = None
        if cgroup and cgroup != "/":
            try:
                target = target_from_labels({"id": cgroup})
            except (NotOnHost, ValueError, UsageError):
                target = None  # the cgroup is gone
            # the victim may linger in cgroup.procs while it dies: only a survivor is diagnosed
            if target is not None and (target.kind != "pid" or target.pid == e.victim_pid):
                target = None
            # the survivor diagnosed may be in another container of the pod (or none): the victim's
            # container (named at the kill) stands in only for the same container
            same = target is not None and container is not None and target.container is not None
            if same and target.container.id == container.id:
                target = target.model_copy(update={"container": container})  # the report in its terms
        record = {**e.model_dump(), "container": container.model_dump() if container else None}
        state = "queued" if target is not None else "recorded"
        where, key = incident_place(e, container), incident_key(e, container)
        # a refused write raises StorageFailing: the OOM watch keeps the kill and records it later
        incident, new = store.record("oomwatch", state, where, record, key, summary=describe(e, container))
        if target is not None and new:
            try:
                worker.submit(incident.id, target)
            except QueueFull:
                store.settle(incident.id, state="recorded", error="queue full: recorded, not diagnosed")

    watcher = None if args.no_oom_watch else OomWatcher(on_kill)
    cfg = Config(
        oom_watch=watcher,
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
    limit = connection_limit()
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        http=bounded_protocol(limit),  # idle deadline and a cap on open connections (connections.py)
        limit_concurrency=limit + BACKLOG,  # a backstop: asyncio accepts up to BACKLOG at once before the cap acts
        backlog=BACKLOG,
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,  # request line and headers
    )
    print(f"memdiag serve: listening on http://{args.listen} (data in {args.data})", flush=True)
    uvicorn.Server(config).run(sockets=[listener])
    return 0
