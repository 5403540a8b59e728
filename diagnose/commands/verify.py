"""Verify a fix: ``memdiag verify --baseline DIR`` diagnoses the service an earlier report did again.

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
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--baseline", type=Path, required=True, metavar="DIR", help="the folder of the earlier report (its report.json)"
    )
    add_target_arguments(parser, verb="instead of finding the service again, verify")
    parser.add_argument(
        "--duration",
        type=DURATION,
        default=None,
        metavar="S",
        help="seconds to watch (default: as long as the earlier report's window)",
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
        print(f"{v.status}: {plain(v.summary)}")
        print(f"report: {plain(folder.path / 'report.md')}")
        raise_if_interrupted(folder)
    return EXIT_CODES[v.status]
