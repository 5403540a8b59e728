"""Compile memdiag's BPF programs for this kernel ahead of time, and measure this host's uprobe trap
costs and what the host-wide probes (fdstack, kmemstack) cost per event of the host (set-up runs this).

A diagnosis then loads cached bytecode and never starts a compiler on a machine short of memory, and
prices allocation tracing from figures measured while the machine was as quiet as its set-up: measured
at a first diagnosis instead, they are whatever else ran then (beside an emulated machine on the other
core, the single-stepped trap came to 8.7 us against 6.8), and they are kept for every later one."""

from __future__ import annotations

import argparse

from memdiag.probes import compiler, hostwide, prepare
from memdiag.probes.memleak.costs import CACHE, host_costs

from ..errors import MemdiagError, PermissionNeeded

SUMMARY = "compile the BPF programs for this kernel and measure uprobe costs (set-up runs it)"
EPILOG = """\
examples:
  memdiag prepare
  memdiag prepare --quiet        say nothing when everything is already done

exit status:
  0  compiled or already cached   1  the compiler failed or is unavailable"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quiet", action="store_true", help="say nothing when everything is already compiled")


def execute(args: argparse.Namespace) -> int:
    try:
        fresh, cached = prepare.prepare()
    except compiler.CompilerUnavailable as e:
        raise PermissionNeeded(f"cannot compile BPF programs here: {e}") from None
    except compiler.CompileError as e:
        raise MemdiagError(f"compiling BPF programs failed: {e}") from None
    if fresh or not args.quiet:
        print(f"BPF programs for this kernel: {fresh} compiled, {cached} already cached in {compiler.cache_dir()}")
    before = CACHE.stat().st_mtime_ns if CACHE.exists() else None
    costs = host_costs()
    measured = CACHE.exists() and CACHE.stat().st_mtime_ns != before
    if costs is None:
        print("this host's uprobe trap costs could not be measured: a diagnosis measures them when it needs them")
    elif measured or not args.quiet:
        print(
            f"this host's uprobe trap costs: {costs.emulated_ns:,.0f} ns emulated, {costs.stepped_ns:,.0f} ns "
            f"single-stepped ({'measured now' if measured else 'already measured'}, {CACHE})"
        )
    # what fdstack's and kmemstack's programs cost per event of the host: their plans price them with it
    wide = hostwide.cached_costs()
    fresh_wide = wide is None
    wide = wide or hostwide.measure()
    if wide is None:
        print("the host-wide probes' costs could not be measured: fdstack and kmemstack are priced with priors")
    elif fresh_wide or not args.quiet:
        said = ", ".join(f"{k} {v:,.0f} ns" for k, v in sorted(wide.program_ns.items()))
        said += "".join(f"; {k} recording one of the target's {v:,.0f} ns more" for k, v in wide.recorded_ns.items())
        print(
            f"host-wide probes' cost per event: {said} ({'measured now' if fresh_wide else 'already measured'}, "
            f"{hostwide.CACHE})"
        )
    return 0
