"""memdiag's command line: ``main(argv) -> int``. Typed errors become exit codes here, and only
here: 0 a completed diagnosis (whatever it found, unless --exit-code asks for its verdict's code;
memdiag verify exits with its status), 2 bad usage, 1 a failure, 130 and 143 a SIGINT or SIGTERM
that cut the command short (its partial report written). A reader that closed the pipe early
(`memdiag rules list | head -1`) had what it wanted: the rest is dropped and the exit is 0.
Bare `memdiag` prints a short usage with examples and exits 2 (argparse's status for a missing
required argument): a whole-system diagnosis is asked for with --system, never started by default.

The parser is also what the man page and the shell completion are generated from
(scripts/gen_manpage.py; tests/unit/test_cli_docs.py keeps them from drifting).

Only the standard library and errors.py are imported at start: the commands (pydantic, bcc's
helpers) load inside main's handlers, with SIGINT and SIGTERM held until they are loaded, so a
Ctrl-C during the imports is one line and exit 130 too, and a SIGTERM one line and exit 143 (the
console script's handler: under emulation the imports took over 25 s, and a SIGTERM then killed
memdiag without a word)."""

from __future__ import annotations

import argparse
import os
import signal
import sys

from .errors import MemdiagError, SignalInterrupted


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        # No abbreviations: `memdiag probe jfr --budget 10` was read as --budget-ms 10 (10 ms of a
        # 15 s recording, 0.067%) without a word; an option is taken only as written.
        kwargs.setdefault("allow_abbrev", False)
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, exit 2, as argparse does, but without the usage dump
        raise _BadUsage(f"{self.prog}: {message} (see --help)")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help that fits the terminal: prose wrapped to its width (options' help, and paragraphs of a
    description or epilog); blocks with indented lines (examples, exit codes) kept as laid out,
    each of their lines at most 79 columns (tests/unit/test_cli.py checks)."""

    def _fill_text(self, text, width, indent):
        import textwrap

        blocks = []
        for block in text.split("\n\n"):
            if any(line.startswith(" ") for line in block.splitlines()):
                blocks.append(textwrap.indent(block, indent))
            else:
                blocks.append(
                    textwrap.fill(" ".join(block.split()), width, initial_indent=indent, subsequent_indent=indent)
                )
        return "\n\n".join(blocks)


class _BadUsage(Exception):
    pass


class _Version(argparse.Action):
    """--version: the installed package's version (the report footer's), read only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .version import memdiag_version

        print(f"memdiag {memdiag_version()}")
        parser.exit(0)


class _Terminated(BaseException):  # as KeyboardInterrupt is to SIGINT: not an Exception, so never swallowed
    """SIGTERM before a command's own handling was in place (the imports, a command without it)."""


def _on_sigterm(signum, frame) -> None:
    raise _Terminated


def _commands() -> dict:
    """The subcommands by name (the main job, the diagnosis, under None)."""
    # A Ctrl-C (and a SIGTERM) is held until the imports are done: a KeyboardInterrupt raised inside a
    # compiled extension's initialisation (pydantic-core importing datetime) comes out as that
    # extension's own panic, not as an interrupt. Released here, it is one inside main's handlers.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        from .commands import prepare, probe, rules, run, serve, top, verify
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return {
        None: run,
        "top": top,
        "probe": probe,
        "rules": rules,
        "serve": serve,
        "prepare": prepare,
        "verify": verify,
    }


DESCRIPTION = "Automated Linux memory diagnosis: counters first, then the code behind the growth."
SEE_ALSO = "memdiag COMMAND --help for a command's options; man memdiag for the manual."


def build_parser() -> argparse.ArgumentParser:
    commands = _commands()
    run = commands[None]
    parser = _Parser(
        prog="memdiag",
        usage="memdiag [-p PID | --cgroup PATH | --container ID|NAME | --system]\n"
        "               [-d DURATION] [-o FORMAT] [options]\n"
        "       memdiag COMMAND [options]",
        description=DESCRIPTION,
        epilog=f"{run.EXAMPLES}\n\n{run.EXIT_CODES_TEXT}\n\n{SEE_ALSO}",
    )
    parser.add_argument("-V", "--version", action=_Version, help="print memdiag's version and exit")
    run.add_arguments(parser)
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, title="commands", prog="memdiag"
    )
    for name, module in commands.items():
        if name is not None:
            epilog = module.epilog() if callable(getattr(module, "epilog", None)) else module.EPILOG
            module.add_arguments(
                sub.add_parser(name, help=module.SUMMARY, description=_sentence(module.SUMMARY), epilog=epilog)
            )
    return parser


def _sentence(summary: str) -> str:
    return summary[:1].upper() + summary[1:] + "."


def bare_usage() -> str:
    """What bare `memdiag` prints: the usage line and examples, no diagnosis started."""
    from .commands import run

    return (
        "usage: memdiag -p PID | --cgroup PATH | --container ID|NAME | --system\n"
        "               [-d DURATION] [-o json] [options]\n"
        "       memdiag COMMAND [options]   (top, probe, rules, serve, verify, prepare)\n\n"
        f"{run.EXAMPLES}\n\n{SEE_ALSO}"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if not argv:
            print(bare_usage(), file=sys.stderr)
            return 2
        code = _execute(build_parser().parse_args(argv))
        try:
            sys.stdout.flush()  # a closed pipe is seen here, not at the interpreter's exit
        except BrokenPipeError:  # the reader had what it wanted; the command's status still holds
            _drop_stdout()
        return code
    except _BadUsage as e:
        _say(str(e), prefix="")
        return 2
    except SignalInterrupted as e:  # the partial output is written: say so, exit as the shell would
        _say(str(e))
        return 128 + e.signum
    except MemdiagError as e:
        _say(str(e))
        return e.exit_code
    except KeyboardInterrupt:  # perhaps during the imports: nothing more to load to say so
        print("memdiag: interrupted", file=sys.stderr)
        return 130
    except _Terminated:
        print("memdiag: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:  # the reader closed the pipe (`| head -1`): it had what it wanted
        _drop_stdout()
        return 0
    except Exception as e:  # the last line of defence: one line, unless debugging
        if os.environ.get("MEMDIAG_DEBUG"):
            raise
        _say(f"internal error: {type(e).__name__}: {e} (set MEMDIAG_DEBUG=1 for the traceback)")
        return 1


def _drop_stdout() -> None:
    """Whatever is left in stdout's buffer goes nowhere: flushing it at exit would raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (an in-process caller's)
        pass


def _execute(args: argparse.Namespace) -> int:
    from memdiag.system.signals import signals_caught

    commands = _commands()
    module = commands[args.command]
    # Commands that stop cleanly on SIGINT/SIGTERM: detach, write what they have, exit 128 + the
    # signal. (serve has its own handling: the web server's.)
    if module not in (commands[None], commands["probe"], commands["top"], commands["verify"]):
        return module.execute(args)
    with signals_caught():
        return module.execute(args)


def _say(message: str, prefix: str = "memdiag: ") -> None:
    """A message on stderr, its first line prefixed; whatever outside text it quotes (a path, a
    rule file's line, a comm) with its control characters visible."""
    from .render.text import plain

    lines = message.splitlines() or [""]
    print("\n".join([prefix + plain(lines[0]), *map(plain, lines[1:])]), file=sys.stderr)


# glibc's mallopt parameter for the most arenas malloc makes (malloc.h: M_ARENA_MAX)
M_ARENA_MAX = -8


def one_malloc_arena() -> bool:
    """glibc's malloc in one arena for every thread memdiag starts (mallopt M_ARENA_MAX 1, set before
    the first thread): whether it was set. A long window's threads (the sampler's, the scan's, a
    probe's detach) each got an arena of their own, and the main one kept freed memory in holes it
    could not give back. Measured here (memdiag's RSS without and with it, two pairs of long windows
    side by side on dayshift, 60 s cycles): 78.9 and 71.9 MiB at 8 minutes; 84.8 and 78.0 MiB at 34,
    the main arena 23.9 MiB of which 10.1 free, and 15.9 of which 2.0. Threads wait on one lock
    instead; memdiag's few threads seldom allocate at once. Another C library (musl) has no such
    setting: nothing is changed there."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):
        return False
    return mallopt(M_ARENA_MAX, 1) == 1


def entry() -> None:  # console script entry point
    one_malloc_arena()
    signal.signal(signal.SIGTERM, _on_sigterm)  # SIGINT's KeyboardInterrupt, for SIGTERM
    try:
        code = main(sys.argv[1:])
    except KeyboardInterrupt:  # a second Ctrl-C, while the first was being reported
        code = 130
    except _Terminated:
        code = 143
    sys.exit(code)
