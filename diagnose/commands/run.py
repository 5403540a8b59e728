"""The main job: ``memdiag --pid N | --cgroup PATH | --container ID|NAME`` (or no target: the whole system) samples the
counters over a window, writes report.md and report.json, prints the verdict and the path."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from memdiag.rules.loader import RuleFileError
from memdiag.system.signals import INTERRUPTION, phase

from ..errors import MemdiagError, PermissionNeeded, SignalInterrupted, UsageError
from ..options import DURATION, INTERVAL, MILLISECONDS, PERCENT, PID, add_playbook_option
from ..outfiles import ReportFolder, open_report_folder
from ..progress import Progress
from ..render import render_all
from ..render.text import plain
from ..report import Interrupted
from ..target import Target, cgroup_target, container_target, pid_target, system_target, with_container
from ..workflow import DEFAULT_BUDGET_PERCENT, DEFAULT_MAX_PAUSE_MS, diagnose, load_book

NICENESS = 10


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pid", type=PID, help="diagnose this process")
    group.add_argument(
        "--cgroup", metavar="PATH", help="diagnose this memory cgroup (a path in the hierarchy or under /sys/fs/cgroup)"
    )
    group.add_argument(
        "--container",
        metavar="ID|NAME",
        help="diagnose this container's memory cgroup: its full id, a unique id prefix (4 hex digits or more) or "
        "its name (names through podman, docker or crictl)",
    )
    parser.add_argument(
        "--duration", type=DURATION, default=30.0, metavar="S", help="seconds to watch the counters (default 30)"
    )
    parser.add_argument(
        "--interval",
        type=INTERVAL,
        default=None,
        metavar="S",
        help="seconds between samples (default: about 1, at least 10 samples)",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder for the report, created mode 700 if new; an existing one must be root's or yours and not "
        "group/world-writable (default: a new timestamped folder here)",
    )
    parser.add_argument(
        "--budget",
        type=PERCENT,
        default=DEFAULT_BUDGET_PERCENT,
        metavar="PERCENT",
        help="how much the diagnosis may slow the target (default 2)",
    )
    parser.add_argument(
        "--max-pause",
        type=MILLISECONDS,
        default=DEFAULT_MAX_PAUSE_MS,
        metavar="MS",
        help=f"longest the reachability scan may stop the target, within the budget (default {DEFAULT_MAX_PAUSE_MS:g})",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the verdict and the report's path")
    add_playbook_option(parser)


def _target(args: argparse.Namespace) -> Target:
    if args.pid is not None:
        target = pid_target(args.pid)
        smaps = Path(f"/proc/{args.pid}/smaps_rollup")
        try:
            smaps.open().close()
        except PermissionError:
            hint = (
                "the kernel refused even root (the process holds capabilities this one lacks, or lives in "
                "another user namespace)"
                if os.geteuid() == 0
                else "run as root or as the process's user"
            )
            raise PermissionNeeded(f"cannot read {smaps}: permission denied; {hint}") from None
        except FileNotFoundError:
            pass  # kernels before 4.14 have no smaps_rollup; status still gives RSS
        return with_container(target)  # a process in a container: the report names the container too
    if args.cgroup is not None:
        return cgroup_target(args.cgroup)
    if args.container is not None:
        return container_target(args.container)
    return system_target()


def _output_dir(args: argparse.Namespace, target: Target) -> ReportFolder:
    """Create (and prove writable, and safe from other users) the report folder before the window."""
    if args.output is not None:
        return open_report_folder(args.output, f"--output {args.output}")
    suffix = f"-pid{target.pid}" if target.pid else ""
    if target.container is not None:
        suffix = f"-{target.container.short_id}"
    out = Path.cwd() / f"memdiag-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"
    return open_report_folder(out, f"report folder {out}")


def execute(args: argparse.Namespace) -> int:
    try:
        rules = load_book(args.playbook)
    except RuleFileError as e:
        raise UsageError(e.usage_text()) from None
    target = _target(args)
    with _output_dir(args, target) as folder:
        return _diagnose(args, target, rules, folder)


def _diagnose(args: argparse.Namespace, target: Target, rules, folder: ReportFolder) -> int:
    out = folder.path
    # memdiag's own work (bcc's compiler, symbolization) must not compete with the target for CPU:
    # on a small machine that costs the target more than the probes do (see BENCHMARKS.md).
    os.nice(NICENESS)
    progress = Progress(args.duration, enabled=not args.quiet and sys.stderr.isatty())
    progress.step(f"diagnosing {target.describe()}")
    report = diagnose(
        target,
        args.duration,
        args.interval,
        args.budget,
        on_sample=progress.on_sample,
        rules=rules,
        on_step=progress.step,
        max_pause_ms=args.max_pause,
    )
    progress.done()
    with phase("writing the report"):
        _write(folder, report)
    if INTERRUPTION.caught and report.interrupted is None:  # it came while the whole report was written
        at = time.time() - (time.monotonic() - (INTERRUPTION.at or time.monotonic())) - report.window.started
        cut = Interrupted(signal=INTERRUPTION.signal_name, phase=INTERRUPTION.phase or "unknown", at_s=round(at, 2))
        report = report.model_copy(update={"interrupted": cut})
        _write(folder, report)
    print(f"{report.verdict.kind}: {plain(report.verdict.summary)}")
    print(f"report: {plain(out / 'report.md')}")
    if INTERRUPTION.caught:
        raise SignalInterrupted(
            INTERRUPTION.signum or 0,
            f"interrupted by {INTERRUPTION.signal_name} during {INTERRUPTION.phase}; "
            f"partial report: {out / 'report.md'}",
        )
    return 0


def _write(folder: ReportFolder, report) -> None:
    """Every file of the report, each replaced whole; the verdict kept in the message if that fails."""
    try:
        folder.write(render_all(report))
    except OSError as e:
        raise MemdiagError(
            f"cannot write the report in {folder.path} ({e.strerror or e}); "
            f"the verdict was {report.verdict.kind}: {report.verdict.summary}"
        ) from None
