"""Long-running agent: ``memdiag serve [--listen ADDR:PORT] [--token-file F] [--data DIR]`` turns
alerts (Alertmanager, Grafana, plain JSON) into diagnoses and records every OOM kill."""

from __future__ import annotations

import argparse
import ipaddress
import math
import os
import sqlite3
from pathlib import Path

from ..errors import PermissionNeeded, UsageError
from ..workflow import DEFAULT_BUDGET_PERCENT, load_book


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
    parser.add_argument("--duration", type=float, default=30.0, metavar="S", help="window of each diagnosis")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_PERCENT, metavar="PERCENT")
    parser.add_argument("--queue", type=int, default=16, metavar="N", help="diagnoses waiting at most (429 beyond)")
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
        type=_positive_int,
        default=10_000,
        metavar="N",
        help="incidents kept at most; the oldest finished ones (and their reports) go first (default 10000)",
    )
    parser.add_argument(
        "--max-report-mb",
        type=_positive_int,
        default=512,
        metavar="MB",
        help="report bytes kept at most, oldest finished incidents evicted first (default 512)",
    )
    parser.add_argument(
        "--dedupe-window",
        type=_positive_float,
        default=86_400.0,
        metavar="S",
        help="a diagnosed alert delivered again within this many seconds is not diagnosed again (default 86400, "
        "longer than Alertmanager's default repeat_interval of 4 h)",
    )
    parser.add_argument(
        "--max-attempts",
        type=_positive_int,
        default=3,
        metavar="N",
        help="diagnoses started per alert (restarts and re-deliveries) before it stays failed (default 3)",
    )
    parser.add_argument("--no-oom-watch", action="store_true", help="do not watch for OOM kills")
    parser.add_argument(
        "--playbook",
        type=Path,
        action="append",
        default=[],
        metavar="PATH",
        help="also load this rule file or folder (root-owned, not group/world-writable); repeatable",
    )


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number above 0")
    return value


def _secret(path: Path | None, what: str) -> str | None:
    if path is None:
        return None
    try:
        value = path.read_text().strip()
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read ({e.strerror or e})") from None
    if not value:
        raise UsageError(f"{what} {path}: empty")
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


def execute(args: argparse.Namespace) -> int:
    import uvicorn
    from memdiag.rules.loader import RuleFileError

    from ..serve.app import Config, Metrics, create_app
    from ..serve.oomwatch import OomWatcher, describe
    from ..serve.security import RateLimiter
    from ..serve.store import DataInUse, Limits, Store, UnsafeData
    from ..serve.targets import NotOnHost, target_from_labels
    from ..serve.worker import QueueFull, Worker

    host, port = _listen(args.listen)
    token = _secret(args.token_file, "--token-file")
    read_token = _secret(args.read_token_file, "--read-token-file")
    if token is None and not _loopback(host):
        raise UsageError(f"--listen {args.listen}: refusing to listen off loopback without --token-file")
    if os.geteuid() != 0:
        raise PermissionNeeded("memdiag serve runs BPF probes: run it as root")
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

    def on_kill(e) -> None:
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
        record = e.model_dump()
        state = "queued" if target is not None else "recorded"
        where = {"kind": "cgroup", "cgroup": cgroup} if cgroup else None
        # a refused write raises StorageFailing: the OOM watch keeps the kill and records it later
        incident, _ = store.record("oomwatch", state, where, record, summary=describe(e))
        if target is not None:
            try:
                worker.submit(incident.id, target)
            except QueueFull:
                store.settle(incident.id, state="recorded", error="queue full: recorded, not diagnosed")

    if not args.no_oom_watch:
        OomWatcher(on_kill)
    cfg = Config(
        store=store,
        worker=worker,
        token=token,
        read_token=read_token,
        grafana_secret=_secret(args.grafana_secret_file, "--grafana-secret-file"),
        grafana_timestamp_header=args.grafana_timestamp_header,
        limiter=RateLimiter(),
    )
    app = create_app(cfg, metrics)
    print(f"memdiag serve: listening on http://{args.listen} (data in {args.data})", flush=True)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)).run()
    return 0
