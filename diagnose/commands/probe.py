"""Run one probe alone: `memdiag probe NAME [-p PID | --cgroup PATH] [-d DURATION] [-o json]`."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

from memdiag.probes.base import ATTACHED
from memdiag.probes.face import Budget, Context, Option
from memdiag.probes.registry import REGISTRY
from memdiag.system.signals import INTERRUPTION, phase, target_released
from memdiag.system.target import Target

from ..errors import PermissionNeeded, SignalInterrupted, UsageError
from ..options import DURATION, FUNCTION, MILLISECONDS, PATTERN, PID, ROWS, SAMPLE_EVERY, SIZE
from ..outfiles import write_file
from ..render.probe_text import render_probe
from ..render.text import json_text, plain
from ..target import cgroup_target, pid_target
from ..workflow import DEFAULT_BUDGET_PERCENT

# How each kind of a probe's own option is read and shown (probes/face.py Option).
_KINDS = {
    "count": (SAMPLE_EVERY, "N"),
    "size": (SIZE, "SIZE"),
    "milliseconds": (MILLISECONDS, "MS"),
    "function": (FUNCTION, "NAME"),
    "pattern": (PATTERN, "PATTERN"),
}


SUMMARY = "run one probe alone and print what it saw"


def epilog() -> str:
    """The probes, one line each from its face (probes/registry.py), then examples and exit codes."""
    names = REGISTRY.summaries()
    width = max(map(len, names))
    probes = "\n".join(
        textwrap.fill(summary, 79, initial_indent=f"  {name:<{width}}  ", subsequent_indent=" " * (width + 4))
        for name, summary in names.items()
    )
    return f"""\
probes:
{probes}

With no target a probe watches the whole system; one marked (one process) needs -p PID.

examples:
  memdiag probe memleak -p 1234 -d 30s
  memdiag probe faults --cgroup /system.slice/app.service --top 5
  memdiag probe oomkill -d 10m
  memdiag probe memleak -p 1234 -o json | jq .status
  memdiag probe faults -p 1234 --folded faults.folded

exit status:
  0  the probe ran (or said why it could not: its reason is printed)
  1  a failure (no root, the probe failed)
  2  bad usage (a probe that needs -p PID without one, a bad option)
  130, 143  interrupted by SIGINT, SIGTERM (what it saw so far is printed)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=REGISTRY.cli_names(), metavar="PROBE", help="the probe to run (listed below)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-p", "--pid", type=PID, help="trace this process")
    group.add_argument("--cgroup", metavar="PATH", help="trace the processes of this memory cgroup")
    parser.add_argument(
        "-d",
        "--duration",
        type=DURATION,
        default=10.0,
        metavar="DURATION",
        help="how long to trace: 30s, 5m; a plain number is seconds (default 10s)",
    )
    parser.add_argument(
        "-o",
        "--format",
        choices=("text", "json"),
        default="text",
        metavar="FORMAT",
        help="text (default) or json: the result as JSON",
    )
    parser.add_argument("--json", dest="format", action="store_const", const="json", help="the same as -o json")
    parser.add_argument("--folded", type=Path, metavar="FILE", help="write folded stacks (flame graph input)")
    parser.add_argument("--top", type=ROWS, default=10, metavar="N", help="stacks or processes to show (default 10)")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for face in REGISTRY.faces():
        for o in face.options:
            title = o.group or face.name
            _add_option(groups.setdefault(title, parser.add_argument_group(title)), o)


def _add_option(group: argparse._ArgumentGroup, o: Option) -> None:
    if o.kind == "flag":
        group.add_argument(o.flag, action="store_true", help=o.help)
        return
    parse, metavar = _KINDS[o.kind]
    group.add_argument(o.flag, type=parse, default=o.default, metavar=metavar, help=o.help)


def _options(args: argparse.Namespace) -> dict:
    """The probe's own options' values, the variant's settings and --top: its ctx.options."""
    face = REGISTRY.spec(args.name).face()
    values = {o.dest: getattr(args, o.dest) for o in face.options}
    variant = REGISTRY.variant(args.name)
    return {**values, **dict(variant.options if variant else ()), "top": args.top}


def _target(args: argparse.Namespace) -> Target:
    if args.pid is not None:
        return pid_target(args.pid)  # validates: exists, not a zombie or kernel thread
    if args.cgroup is not None:
        return cgroup_target(args.cgroup)
    return Target(kind="system")


def execute(args: argparse.Namespace) -> int:
    face = REGISTRY.spec(args.name).face()
    options = _options(args)
    refused = face.refuse(options)
    if refused:
        raise UsageError(refused)
    kind = "pid" if args.pid is not None else "cgroup" if args.cgroup is not None else "system"
    variant = REGISTRY.variant(args.name)
    if variant is not None and variant.needs_pid and (kind != "pid" or any(options.get(o) for o in variant.refuses)):
        raise UsageError(f"probe {args.name} {variant.needs_pid}")
    if (needs := face.needs(kind, options)) is not None:
        raise UsageError(f"probe {args.name} {needs}")
    if os.geteuid() != 0:
        raise PermissionNeeded("BPF probes need root (CAP_BPF and CAP_PERFMON)")
    target = _target(args)
    # one line once the probe is attached: a caller waits for it instead of guessing a load time
    ATTACHED.append(lambda _: print(f"memdiag probe {args.name}: attached", file=sys.stderr, flush=True))
    ctx = Context(
        seconds=args.duration, budget=Budget(DEFAULT_BUDGET_PERCENT, args.duration), options=options, alone=True
    )
    with phase(f"probe {args.name}"):
        result = face.run(target, ctx)
    target_released()  # what is left is the output: a slow machine's stop is given the time to write it
    if args.folded is not None:
        lines = face.stacks.folded(result) if face.stacks is not None else []
        try:
            write_file(args.folded, "".join(f"{line}\n" for line in lines))
        except OSError as e:
            raise UsageError(f"--folded {args.folded}: cannot write ({e.strerror or e})") from None
    if args.format == "json":
        sys.stdout.write(json_text(result.model_dump_json(indent=2)) + "\n")
    else:
        sys.stdout.write(render_probe(result, top=args.top))
    elf = sys.modules.get("memdiag.probes.elf")  # modules with no symbols: a corrupt or hostile file
    for line in elf.take_notes() if elf is not None else []:
        print(f"  symbols: {plain(line)}", file=sys.stderr if args.format == "json" else sys.stdout)
    if INTERRUPTION.caught:
        raise SignalInterrupted(
            INTERRUPTION.signum or 0, f"interrupted by {INTERRUPTION.signal_name} during {INTERRUPTION.phase}"
        )
    return 0 if result.status in ("ok", "partial", "unavailable") else 1
