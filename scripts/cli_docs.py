"""memdiag's man page and shell completions, generated from its argparse parser (the one home of
every option): argparse-manpage writes the roff page, shtab the bash and zsh completions. The
files are kept in the repository (docs/man/, docs/completion/) and scripts/setup.sh installs them
as they are; tests/unit/test_cli_docs.py runs `--check` so they never drift from the options.

    python scripts/cli_docs.py           rewrite the files from the parser
    python scripts/cli_docs.py --check   exit 1, naming each file, when one differs from the parser's
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# what scripts/setup.sh installs, each from here
FILES = {
    "man": Path("docs/man/memdiag.1"),
    "bash": Path("docs/completion/memdiag.bash"),
    "zsh": Path("docs/completion/_memdiag"),
}


def _parser() -> argparse.ArgumentParser:
    # help is wrapped to the terminal's width: set here, so the files are the same wherever they are
    # made; wide, since man fills the text to the reader's own width
    os.environ["COLUMNS"] = "1000"
    from memdiag.diagnose.cli import build_parser

    return build_parser()


def _roff(text: str) -> str:
    """Text laid out by hand (examples, tables of exit codes) as roff lines kept as they are."""
    lines = []
    for line in text.splitlines():
        line = line.replace("\\", "\\e").replace("-", "\\-")
        lines.append("\\&" + line if line.startswith((".", "'")) else line)
    return ".nf\n" + "\n".join(lines) + "\n.fi"


def manpage() -> str:
    """The page: the parser's options and commands (argparse-manpage), then the sections a man page
    has that argparse does not: examples and exit status of memdiag and of each command, and the
    probes that run alone with their summaries (the faces')."""
    from argparse_manpage.manpage import Manpage
    from memdiag.diagnose.cli import SEE_ALSO, _commands
    from memdiag.diagnose.version import memdiag_version

    parser = _parser()
    commands = _commands()
    run = commands[None]
    parser.epilog = None  # its examples and exit codes get sections of their own, below
    page = Manpage(
        parser,
        {
            "project_name": "memdiag",
            "version": memdiag_version(),
            "manual_title": "memdiag manual",
            "description": "automated Linux memory diagnosis",
        },
    )
    page.date = ""  # no build date: the page is the same whenever it is made
    page.add_section(
        "synopsis",
        "=",
        ".B memdiag\n"
        + "[\\fB\\-p\\fR \\fIPID\\fR | \\fB\\-\\-cgroup\\fR \\fIPATH\\fR | \\fB\\-\\-container\\fR \\fIID|NAME\\fR | "
        + "\\fB\\-\\-system\\fR] [\\fB\\-d\\fR \\fIDURATION\\fR] [\\fB\\-o\\fR \\fIFORMAT\\fR] [\\fIoptions\\fR]\n"
        + ".br\n.B memdiag\n\\fICOMMAND\\fR [\\fIoptions\\fR]",
    )
    examples = [_roff(run.EXAMPLES.split("\n", 1)[1])]
    for name, module in commands.items():
        if name is None:
            continue
        text = module.epilog() if callable(getattr(module, "epilog", None)) else module.EPILOG
        examples.append(f".SS memdiag {name}\n" + _roff(text))
    page.add_section("examples", ">", "\n".join(examples))
    page.add_section("exit status", ">", _roff(run.EXIT_CODES_TEXT.split("\n", 1)[1]))
    page.add_section("see also", ">", SEE_ALSO.split(";")[0].replace("-", "\\-") + "; docs/cli.md in the source tree.")
    return str(page)


def _parsers(parser: argparse.ArgumentParser):
    """The parser and every command's."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def completion(shell: str) -> str:
    """Options, commands and probe names complete; a path option's value completes as a folder
    (metavar DIR) or a file (the others typed Path)."""
    import shtab

    parser = _parser()
    for p in _parsers(parser):
        for action in p._actions:
            if action.type is Path:
                action.complete = shtab.DIRECTORY if action.metavar == "DIR" else shtab.FILE
    return shtab.complete(parser, shell=shell)


def rendered() -> dict[Path, str]:
    return {
        FILES["man"]: manpage(),
        FILES["bash"]: completion("bash"),
        FILES["zsh"]: completion("zsh"),
    }


def main(argv: list[str]) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--check", action="store_true", help="compare, write nothing")
    args.add_argument("--root", type=Path, default=ROOT, help="the tree holding docs/ (default: this repository)")
    opts = args.parse_args(argv)
    stale = []
    for rel, text in rendered().items():
        path = opts.root / rel
        if opts.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(rel))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"cli_docs: out of date with the parser: {', '.join(stale)} (run python scripts/cli_docs.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
