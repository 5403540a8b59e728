"""Compile memdiag's BPF programs for this kernel ahead of time (set-up runs this).

A diagnosis then loads cached bytecode and never starts a compiler on a machine short of memory."""

from __future__ import annotations

import argparse

from memdiag.probes import compiler, prepare

from ..errors import MemdiagError, PermissionNeeded


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
    return 0
