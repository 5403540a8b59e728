"""The main job: ``memdiag --pid N | --cgroup PATH | --container ID|NAME`` (or no target: the whole system) samples the
counters over a window, writes report.md and report.json, prints the verdict and the path."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from memdiag.probes.stacks import release
from memdiag.rules.loader import RuleFileError
from memdiag.system import clock
from memdiag.system.signals import INTERRUPTION, phase, target_released

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
    add_target_arguments(parser)
    parser.add_argument(
        "--duration", type=DURATION, default=30.0, metavar="S", help="seconds to watch the counters (default 30)"
    )
    add_window_arguments(parser)


def add_target_arguments(parser: argparse.ArgumentParser, verb: str = "diagnose") -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pid", type=PID, help=f"{verb} this process")
    group.add_argument(
        "--cgroup", metavar="PATH", help=f"{verb} this memory cgroup (a path in the hierarchy or under /sys/fs/cgroup)"
    )
    group.add_argument(
        "--container",
        metavar="ID|NAME",
        help=f"{verb} this container's memory cgroup: its full id, a unique id prefix (4 hex digits or more) or "
        "its name (names through podman, docker or crictl)",
    )


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a diagnosis but its target and duration (shared with memdiag verify)."""
    parser.add_argument(
        "--cycle",
        type=DURATION,
        default=None,
        metavar="S",
        help="watch the window in cycles of S, the probes run again in each and the report rewritten after "
        "the first and then at most once a minute (default: a 24th of a window of 10 min or more, at least "
        "1 min; none for a shorter one)",
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


def chosen_target(args: argparse.Namespace) -> Target | None:
    """The target the options name, None when they name none (the whole system, for a diagnosis)."""
    if args.pid is None and args.cgroup is None and args.container is None:
        return None
    return _target(args)


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


def output_folder(args: argparse.Namespace, target: Target) -> ReportFolder:
    """Create (and prove writable, and safe from other users) the report folder before the window."""
    if args.output is not None:
        return open_report_folder(args.output, f"--output {args.output}")
    suffix = f"-pid{target.pid}" if target.pid else ""
    if target.container is not None:
        suffix = f"-{target.container.short_id}"
    out = Path.cwd() / f"memdiag-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"
    return open_report_folder(out, f"report folder {out}")


def execute(args: argparse.Namespace) -> int:
    rules = rule_book(args)
    target = _target(args)
    with output_folder(args, target) as folder:
        report = run_diagnosis(args, target, rules, folder)
        print(f"{report.verdict.kind}: {plain(report.verdict.summary)}")
        print(f"report: {plain(folder.path / 'report.md')}")
        raise_if_interrupted(folder)
    return 0


def rule_book(args: argparse.Namespace):
    """The playbook a diagnosis runs: shipped, site and --playbook files, checked; one line if bad."""
    try:
        return load_book(args.playbook)
    except RuleFileError as e:
        raise UsageError(e.usage_text()) from None


def raise_if_interrupted(folder: ReportFolder) -> None:
    """A signal ended the command early: its partial report is written; exit as the shell would."""
    if INTERRUPTION.caught:
        raise SignalInterrupted(
            INTERRUPTION.signum or 0,
            f"interrupted by {INTERRUPTION.signal_name} during {INTERRUPTION.phase}; "
            f"partial report: {folder.path / 'report.md'}",
        )


def run_diagnosis(args: argparse.Namespace, target: Target, rules, folder: ReportFolder, finish=None, given=None):
    """The diagnosis of target over args.duration, its report written in folder; finish(report),
    when given, completes the report before it is written (memdiag verify's comparison); given:
    facts known beforehand."""
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
        given=given,
        cycle_s=args.cycle,
        on_interim=lambda r: _write_interim(folder, r),
    )
    target_released()  # what is left is the report: a slow machine's stop is given the time to write it
    progress.done()
    if finish is not None:
        report = finish(report)
    release()  # the report holds every name it needs: the files read for them are let go first
    with phase("writing the report"):
        _write(folder, report)
    if INTERRUPTION.caught and report.interrupted is None:  # it came while the whole report was written
        at = clock.wall_of(INTERRUPTION.at or time.monotonic()) - report.window.started
        cut = Interrupted(signal=INTERRUPTION.signal_name, phase=INTERRUPTION.phase or "unknown", at_s=round(at, 2))
        report = report.model_copy(update={"interrupted": cut})
        _write(folder, report)
    return report


def _write_interim(folder: ReportFolder, report) -> None:
    """A long window's report so far, after a cycle: readable mid-way, and what is left after a
    crash. A failure to write it is said on stderr and the diagnosis goes on."""
    with phase("writing the report so far"):
        try:
            folder.write(render_all(report))
        except OSError as e:
            said = f"memdiag: could not write the report so far in {plain(folder.path)}: {e.strerror or e}"
            print(said, file=sys.stderr)


def _write(folder: ReportFolder, report) -> None:
    """Every file of the report, each replaced whole; the verdict kept in the message if that fails."""
    try:
        folder.write(render_all(report))
    except OSError as e:
        raise MemdiagError(
            f"cannot write the report in {folder.path} ({e.strerror or e}); "
            f"the verdict was {report.verdict.kind}: {report.verdict.summary}"
        ) from None
