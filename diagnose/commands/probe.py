"""Run one BPF probe alone: ``memdiag probe NAME [--pid N | --cgroup PATH] --duration S [--json]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from memdiag.probes.base import ATTACHED, INTERRUPTION, ProbeTarget, phase
from memdiag.probes.calibrate import host_costs
from memdiag.probes.registry import REGISTRY

from ..errors import PermissionNeeded, SignalInterrupted, UsageError
from ..options import DURATION, MILLISECONDS, PID, ROWS, SAMPLE_EVERY, SIZE
from ..outfiles import write_file
from ..render.probe_text import render_probe
from ..render.text import json_text
from ..target import cgroup_target, pid_target
from ..workflow import DEFAULT_BUDGET_PERCENT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=REGISTRY.cli_names(), help="the probe to run")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--pid", type=PID, help="trace this process")
    group.add_argument("--cgroup", metavar="PATH", help="trace the processes of this memory cgroup")
    parser.add_argument("--duration", type=DURATION, default=10.0, metavar="S", help="seconds to trace (default 10)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--folded", type=Path, metavar="FILE", help="write folded stacks (flame graph input)")
    parser.add_argument("--top", type=ROWS, default=10, metavar="N", help="stacks or processes to show (default 10)")
    mem = parser.add_argument_group("memleak")
    mem.add_argument("--sample-every", type=SAMPLE_EVERY, default=1, metavar="N", help="trace 1 in N allocations")
    mem.add_argument("--min-size", type=SIZE, default=0, metavar="SIZE", help="ignore smaller allocations")
    mem.add_argument("--max-size", type=SIZE, default=None, metavar="SIZE", help="ignore larger allocations")
    mem.add_argument(
        "--snoop",
        type=SIZE,
        default=0,
        metavar="SIZE",
        help="also list single allocations of at least SIZE (e.g. 1MiB)",
    )
    mem.add_argument("--kernel", action="store_true", help="kernel allocations (kmem tracepoints)")
    rch = parser.add_argument_group("reach")
    rch.add_argument(
        "--max-pause",
        type=MILLISECONDS,
        default=None,
        metavar="MS",
        help="skip the scan if it would stop the target longer (default: 2%% of --duration)",
    )


def execute(args: argparse.Namespace) -> int:
    if args.max_size is not None and args.max_size < args.min_size:
        raise UsageError("--max-size is smaller than --min-size")
    if os.geteuid() != 0:
        raise PermissionNeeded("BPF probes need root (CAP_BPF and CAP_PERFMON)")
    if args.pid is not None:
        pid_target(args.pid)  # validates: exists, not a zombie or kernel thread
        target = ProbeTarget.for_pid(args.pid)
    elif args.cgroup is not None:
        loc = cgroup_target(args.cgroup).cgroup
        target = ProbeTarget.for_cgroup(loc.fs_path, loc.path)
    else:
        target = ProbeTarget(kind="system")
    variant = REGISTRY.variant(args.name)
    if variant is not None and variant.pid_only and (args.kernel or target.kind != "pid"):
        raise UsageError(f"probe {args.name} scans one process's memory: give --pid (user-space allocations)")
    # one line once the probe is attached: a caller waits for it instead of guessing a load time
    ATTACHED.append(lambda _: print(f"memdiag probe {args.name}: attached", file=sys.stderr, flush=True))
    with phase(f"probe {args.name}"):
        result = _run(REGISTRY.spec(args.name).loader(), args, target)
    if args.folded is not None:
        lines = getattr(result, "folded", [])
        try:
            write_file(args.folded, "".join(f"{line}\n" for line in lines))
        except OSError as e:
            raise UsageError(f"--folded {args.folded}: cannot write ({e.strerror or e})") from None
    if args.json:
        sys.stdout.write(json_text(result.model_dump_json(indent=2)) + "\n")
    else:
        sys.stdout.write(render_probe(result, top=args.top))
    if INTERRUPTION.caught:
        raise SignalInterrupted(
            INTERRUPTION.signum or 0, f"interrupted by {INTERRUPTION.signal_name} during {INTERRUPTION.phase}"
        )
    return 0 if result.status in ("ok", "partial", "unavailable") else 1


def _run(module, args: argparse.Namespace, target: ProbeTarget):
    """The probe's run(); memleak (and its reach variant) with the options of its argument group."""
    if REGISTRY.spec(args.name).name == "memleak":
        return module.run(
            target,
            args.duration,
            kernel_mode=args.kernel,
            sample_every=args.sample_every,
            min_size=args.min_size,
            max_size=args.max_size,
            snoop_min=args.snoop,
            top=args.top,
            costs=None if args.kernel else host_costs(),  # the target's time it cost, measured
            scan_reach=args.name == "reach",
            reach_allowed_ms=args.max_pause
            if args.max_pause is not None
            else DEFAULT_BUDGET_PERCENT / 100 * args.duration * 1000,
        )
    return module.run(target, args.duration)
