"""The man page and the shell completions never drift from the parser (issue 49, item 3): the files
kept in docs/ are what scripts/cli_docs.py makes from the parser now, scripts/install_cli_docs.sh
(run by scripts/setup.sh) installs exactly them, every option of every command is in each, and the
real `man` and the real bash read them."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from memdiag.diagnose.cli import build_parser
from memdiag.probes.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "scripts" / "cli_docs.py"
FILES = {"man": ROOT / "docs/man/memdiag.1", "bash": ROOT / "docs/completion/memdiag.bash",
         "zsh": ROOT / "docs/completion/_memdiag"}  # fmt: skip


def _options() -> dict[str, set[str]]:
    """Every option string of memdiag and of each command, by command ('' for memdiag's own)."""
    found: dict[str, set[str]] = {}
    top = build_parser()
    found[""] = {o for a in top._actions for o in a.option_strings}
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = {o for a in sub._actions for o in a.option_strings}
    return found


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), *args], capture_output=True, text=True, timeout=120)


def test_the_kept_files_are_what_the_parser_makes_now():
    r = _generate("--check")
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_check_names_a_file_that_drifted(tmp_path):
    for path in FILES.values():
        dest = tmp_path / path.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, dest)
    bash = tmp_path / "docs/completion/memdiag.bash"
    bash.write_text(bash.read_text().replace(" --exit-code", ""))  # as if the option were added since
    r = _generate("--check", "--root", str(tmp_path))
    assert r.returncode == 1
    assert (
        r.stdout
        == "cli_docs: out of date with the parser: docs/completion/memdiag.bash (run python scripts/cli_docs.py)\n"
    )


def test_every_option_and_probe_is_in_the_man_page_and_the_completions():
    man = FILES["man"].read_text().replace("\\-", "-")
    bash, zsh = FILES["bash"].read_text(), FILES["zsh"].read_text()
    for command, options in _options().items():
        if command:
            assert f"COMMAND \\fI\\,'memdiag {command}'" in man, command
        for option in options - {"-h", "--help"}:
            assert f"\\fB{option}\\fR" in man, (command, option)
            assert option in bash and option in zsh, (command, option)
    for probe, summary in REGISTRY.summaries().items():
        assert probe in bash and probe in zsh
        assert summary.split()[0].replace("-", "\\-") in FILES["man"].read_text(), probe


def test_setup_installs_exactly_the_kept_files(tmp_path):
    """scripts/install_cli_docs.sh, as setup.sh runs it, into a throwaway root."""
    env = {**os.environ, "DESTDIR": str(tmp_path)}
    script = ROOT / "scripts/install_cli_docs.sh"
    r = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    installed = {
        "man": tmp_path / "usr/local/share/man/man1/memdiag.1",
        "bash": tmp_path / "usr/share/bash-completion/completions/memdiag",
        "zsh": tmp_path / "usr/local/share/zsh/site-functions/_memdiag",
    }
    for kind, path in installed.items():
        assert path.read_bytes() == FILES[kind].read_bytes(), kind
        assert f"setup: installed {path}" in r.stdout
    again = subprocess.run([str(script)], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and again.stdout == ""  # quiet when all is in place
    assert "install_cli_docs.sh" in (ROOT / "scripts/setup.sh").read_text()


@pytest.mark.skipif(shutil.which("man") is None, reason="needs man (man-db)")
def test_man_renders_the_page_with_its_sections():
    env = {**os.environ, "MANWIDTH": "80"}
    r = subprocess.run(["man", "-l", str(FILES["man"])], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    text = re.sub(".\x08", "", r.stdout)  # bold and underline, as overstrikes when not a terminal
    for heading in ("NAME", "SYNOPSIS", "OPTIONS", "EXAMPLES", "EXIT STATUS", "SEE ALSO"):
        assert f"\n{heading}\n" in text, heading
    assert "memdiag - automated Linux memory diagnosis" in text
    assert "memdiag -p 1234 -o json | jq .verdict.kind" in text
    assert "3 leak, 4 growth, 5 inconclusive, 6 oom, 7 pressure" in text


def _complete(words: str) -> list[str]:
    """What the real bash offers for the command line `words` (the cursor at its end)."""
    line = f"memdiag {words}"
    script = f"""
source {FILES["bash"]}
COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}
read -ra COMP_WORDS <<< "$COMP_LINE"
[[ "$COMP_LINE" == *' ' ]] && COMP_WORDS+=('')
COMP_CWORD=$(( ${{#COMP_WORDS[@]}} - 1 ))
_shtab_memdiag
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return sorted(set(r.stdout.split()))


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_options_and_probe_names():
    assert _complete("pro") == ["probe"]
    assert _complete("probe me") == ["memleak"]
    assert "--exit-code" in _complete("--ex") and "--system" in _complete("--sys")
    assert _complete("rules ") == ["check", "list"]
    assert _complete("-o ") == ["json", "text"]
