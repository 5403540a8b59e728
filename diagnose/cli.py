"""memdiag's command line: ``main(argv) -> int``. Typed errors become exit codes here, and only
here: 0 a completed diagnosis (whatever it found), 2 bad usage, 1 a failure, 130 and 143 a SIGINT
or SIGTERM that cut the command short (its partial report written)."""

from __future__ import annotations

import argparse
import os
import sys

from memdiag.probes.base import signals_caught

from .commands import prepare, probe, rules, run, serve, top
from .errors import MemdiagError, SignalInterrupted

_SUBCOMMANDS = {"top": top, "probe": probe, "rules": rules, "serve": serve, "prepare": prepare}
# Commands that stop cleanly on SIGINT/SIGTERM: detach, write what they have, exit 128 + the signal.
# (serve has its own handling: the web server's.)
_CATCH_SIGNALS = (run, probe, top)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, as argparse does, but without the usage dump
        raise _BadUsage(f"{self.prog}: {message} (see --help)")


class _BadUsage(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="memdiag",
        description="Automated Linux memory diagnosis: counters first, then the code behind the growth.",
    )
    run.add_arguments(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _SUBCOMMANDS.items():
        module.add_arguments(sub.add_parser(name, help=module.__doc__.strip().splitlines()[0]))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        module = _SUBCOMMANDS.get(args.command, run)
        if module not in _CATCH_SIGNALS:
            return module.execute(args)
        with signals_caught():
            return module.execute(args)
    except _BadUsage as e:
        print(str(e), file=sys.stderr)
        return 2
    except SignalInterrupted as e:  # the partial output is written: say so, exit as the shell would
        print(f"memdiag: {e}", file=sys.stderr)
        return 128 + e.signum
    except MemdiagError as e:
        lines = str(e).splitlines() or [""]
        print("\n".join([f"memdiag: {lines[0]}", *lines[1:]]), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("memdiag: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as e:  # the last line of defence: one line, unless debugging
        if os.environ.get("MEMDIAG_DEBUG"):
            raise
        print(
            f"memdiag: internal error: {type(e).__name__}: {e} (set MEMDIAG_DEBUG=1 for the traceback)", file=sys.stderr
        )
        return 1


def entry() -> None:  # console script entry point
    sys.exit(main(sys.argv[1:]))
