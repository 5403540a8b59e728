"""The main job: ``memdiag -p PID | --cgroup PATH | --container ID|NAME | --system`` samples the
counters over a window, runs the probes they point at, writes the report folder (report.md,
report.json ...), prints the verdict and the path (``-o json``: the report's JSON on stdout)."""

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

# --exit-code: the exit status by verdict, for scripts (verify's own: 3 still leaking, 4 new
# growth, 5 inconclusive; the same numbers mean the same here). A verdict not listed exits 0.
VERDICT_EXIT_CODES = {"leak": 3, "growth": 4, "inconclusive": 5, "oom": 6, "pressure": 7}

SUMMARY = "diagnose a process, cgroup, container or the whole system (the main job)"
EXAMPLES = """\
examples:
  memdiag -p 1234              diagnose process 1234 for 30 s, report here
  memdiag -p 1234 -d 5m        for five minutes (also 90s, 2h30m, 1d)
  memdiag --container web      a container's memory cgroup (id, prefix or name)
  memdiag --cgroup /system.slice/app.service
  memdiag --system -d 1m       the whole system
  memdiag -p 1234 -o json | jq .verdict.kind
  memdiag -p 1234 --exit-code || echo "needs a look"
  memdiag top                  live per-process memory view
  memdiag probe --help         the probes that run alone"""
EXIT_CODES_TEXT = f"""\
exit status:
  0    the diagnosis completed (whatever it found, unless --exit-code)
  1    a failure (no permission, a report that could not be written)
  2    bad usage (one line on stderr says what)
  {", ".join(f"{code} {kind}" for kind, code in VERDICT_EXIT_CODES.items())}
       with --exit-code, by verdict (healthy and cache: 0)
  130  interrupted by SIGINT, 143 by SIGTERM (the partial report is written)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "-d",
        "--duration",
        type=DURATION,
        default=30.0,
        metavar="DURATION",
        help="how long to watch: 90s, 5m, 2h30m, 1d; a plain number is seconds (default 30s)",
    )
    add_window_arguments(parser)
    parser.add_argument(
        "--exit-code",
        action="store_true",
        help="exit by verdict, for scripts: "
        + ", ".join(f"{k} {c}" for k, c in VERDICT_EXIT_CODES.items())
        + " (healthy and cache 0)",
    )


def add_target_arguments(parser: argparse.ArgumentParser, verb: str = "diagnose") -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-p", "--pid", type=PID, help=f"{verb} this process")
    group.add_argument(
        "--cgroup", metavar="PATH", help=f"{verb} this memory cgroup (a path in the hierarchy or under /sys/fs/cgroup)"
    )
    group.add_argument(
        "--container",
        metavar="ID|NAME",
        help=f"{verb} this container's memory cgroup: its full id, a unique id prefix (4 hex digits or more) or "
        "its name (names through podman, docker or crictl)",
    )
    group.add_argument("--system", action="store_true", help=f"{verb} the whole system")


def add_window_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a diagnosis but its target and duration (shared with memdiag verify)."""
    parser.add_argument(
        "--cycle",
        type=DURATION,
        default=None,
        metavar="DURATION",
        help="watch the window in cycles of DURATION (e.g. 1h), the probes run again in each and the report "
        "rewritten after the first and then at most once a minute (default: a 24th of a window of 10 min or "
        "more, at least 1 min; none for a shorter one)",
    )
    parser.add_argument(
        "--interval",
        type=INTERVAL,
        default=None,
        metavar="DURATION",
        help="time between samples: 1s, 500ms; a plain number is seconds (default: about 1s, at least 10 samples)",
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
        "-o",
        "--format",
        choices=("text", "json"),
        default="text",
        metavar="FORMAT",
        help="text: the verdict line and the report's path (default); json: the report's JSON (report.json) on "
        "stdout, the verdict and path on stderr",
    )
    parser.add_argument(
        "--no-folder",
        action="store_true",
        help="write no report folder (with -o json: the JSON on stdout is the whole output)",
    )
    parser.add_argument(
        "--budget",
        type=PERCENT,
        default=DEFAULT_BUDGET_PERCENT,
        metavar="PERCENT",
        help=f"how much the diagnosis may slow the target: 2 or 2%% (default {DEFAULT_BUDGET_PERCENT:g}%%)",
    )
    parser.add_argument(
        "--max-pause",
        type=MILLISECONDS,
        default=DEFAULT_MAX_PAUSE_MS,
        metavar="MS",
        help="longest the reachability scan may stop the target, within the budget: 250ms, 1s; a plain number is "
        f"milliseconds (default {DEFAULT_MAX_PAUSE_MS:g})",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the verdict and the report's path")
    add_playbook_option(parser)


def names_a_target(args: argparse.Namespace) -> bool:
    return args.pid is not None or args.cgroup is not None or args.container is not None or args.system


def chosen_target(args: argparse.Namespace) -> Target | None:
    """The target the options name, None when they name none."""
    return _target(args) if names_a_target(args) else None


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


class NoFolder:
    """--no-folder: the report's files kept in memory, nothing written."""

    path = None

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def write(self, files: dict[str, str]) -> None:
        self.files = files

    def __enter__(self) -> NoFolder:
        return self

    def __exit__(self, *exc) -> None:
        pass


def output_folder(args: argparse.Namespace, target: Target) -> ReportFolder | NoFolder:
    """Create (and prove writable, and safe from other users) the report folder before the window."""
    if args.no_folder:
        if args.output is not None:
            raise UsageError("--no-folder and --output: choose one")
        return NoFolder()
    if args.output is not None:
        return open_report_folder(args.output, f"--output {args.output}")
    suffix = f"-pid{target.pid}" if target.pid else ""
    if target.container is not None:
        suffix = f"-{target.container.short_id}"
    out = Path.cwd() / f"memdiag-{time.strftime('%Y%m%d-%H%M%S')}{suffix}"
    return open_report_folder(out, f"report folder {out}")


def execute(args: argparse.Namespace) -> int:
    if not names_a_target(args):
        raise UsageError("name a target: -p PID, --cgroup PATH, --container ID|NAME, or --system for the whole system")
    rules = rule_book(args)  # a bad rule file is bad usage: said before the target is touched
    target = _target(args)
    with output_folder(args, target) as folder:
        report = run_diagnosis(args, target, rules, folder)
        say_result(args, folder, report, f"{report.verdict.kind}: {plain(report.verdict.summary)}")
        raise_if_interrupted(folder)
    if args.exit_code:
        return VERDICT_EXIT_CODES.get(report.verdict.kind, 0)
    return 0


def say_result(args: argparse.Namespace, folder: ReportFolder | NoFolder, report, line: str) -> None:
    """The verdict line and where the report is, on stdout; with -o json the report's JSON is
    stdout's whole content and the two lines go to stderr."""
    where = f"report: {plain(folder.path / 'report.md')}" if folder.path is not None else "report: not written"
    if args.format == "json":
        from ..render.jsonout import render_json

        text = folder.files["report.json"] if isinstance(folder, NoFolder) else render_json(report)
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        if not args.quiet:
            print(line, file=sys.stderr)
            print(where, file=sys.stderr)
        return
    print(line)
    if folder.path is not None:
        print(where)


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
            f"interrupted by {INTERRUPTION.signal_name} during {INTERRUPTION.phase}"
            + (f"; partial report: {folder.path / 'report.md'}" if folder.path is not None else ""),
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
