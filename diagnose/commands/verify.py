"""Verify a fix: `memdiag verify --baseline DIR` diagnoses the service an earlier report did again.

The service is found by what that report recorded (its container's name, command line, cgroup),
since its pid changed with the restart, or named with --pid/--cgroup/--container; it is watched
for as long as before (or --duration), and the new report says, stack by stack, whether each
earlier culprit is fixed or still leaking and whether another stack grows now. The exit status
is for scripts: 0 fixed, 3 still leaking, 4 new growth, 5 inconclusive (2 bad usage, 1 failure)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import DURATION
from ..render.text import plain
from ..verify import EXIT_CODES, baseline_facts, compare, find_service, read_baseline
from .run import (
    add_target_arguments,
    add_window_arguments,
    chosen_target,
    output_folder,
    raise_if_interrupted,
    rule_book,
    run_diagnosis,
    say_result,
)

SUMMARY = "diagnose a service again after a fix and compare with an earlier report"
EPILOG = """\
The service is found again by what the earlier report recorded (its
container's name, command line, cgroup), since its pid changed with the
restart; or name it with -p, --cgroup or --container.

examples:
  memdiag verify --baseline memdiag-20260101-120000-pid1234
  memdiag verify --baseline old-report -p 4321 -d 10m

exit status:
  0  fixed              3  still leaking       4  new growth
  5  inconclusive       1  a failure           2  bad usage
  130, 143  interrupted by SIGINT, SIGTERM (the partial report is written)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline", type=Path, required=True, metavar="DIR", help="the folder of the earlier report (its report.json)"
    )
    add_target_arguments(parser, verb="instead of finding the service again, verify")
    parser.add_argument(
        "-d",
        "--duration",
        type=DURATION,
        default=None,
        metavar="DURATION",
        help="how long to watch: 90s, 5m, 2h30m; a plain number is seconds (default: as long as the earlier "
        "report's window)",
    )
    add_window_arguments(parser)


def execute(args: argparse.Namespace) -> int:
    base = read_baseline(args.baseline)
    rules = rule_book(args)
    named = chosen_target(args)
    target, found_by = (named, "the target named on the command line") if named else find_service(base)
    if args.duration is None:
        args.duration = base.window.requested_s
    with output_folder(args, target) as folder:

        def finish(report):
            return report.model_copy(update={"verification": compare(base, report, args.baseline, found_by)})

        report = run_diagnosis(args, target, rules, folder, finish=finish, given=baseline_facts(base))
        v = report.verification
        say_result(args, folder, report, f"{v.status}: {plain(v.summary)}")
        raise_if_interrupted(folder)
    return EXIT_CODES[v.status]
