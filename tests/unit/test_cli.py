"""The command line's conventions (issue 49): --version, short options, durations and percentages
as operators type them, bare `memdiag` printing usage instead of diagnosing the whole system, help
that fits the terminal with examples and exit codes, a closed pipe ending quietly, one line and
exit 2 for a probe without the target it needs. The installed console script runs as a user runs
it (a real process, a real pipe); nothing here needs root or BPF."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from kit import MEMDIAG
from memdiag.diagnose.cli import _commands, build_parser
from memdiag.diagnose.commands.run import VERDICT_EXIT_CODES
from memdiag.diagnose.options import DURATION, MILLISECONDS, PERCENT
from memdiag.diagnose.version import memdiag_version
from memdiag.probes.registry import REGISTRY
from memdiag.rules.catalog import FACTS
from memdiag.system.units import parse_duration

COMMANDS = ("", "top", "probe", "rules", "serve", "prepare", "verify")


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([MEMDIAG, *args], capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(
    "text, seconds",
    [("30", 30), ("1.5", 1.5), ("90s", 90), ("5m", 300), ("5min", 300), ("2h30m", 9000), ("1d", 86400),
     ("1h0m30s", 3630), ("500ms", 0.5), ("1.5h", 5400)],
)  # fmt: skip
def test_durations_as_operators_type_them(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert DURATION(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["5x", "5mb", "2h30", "h", "", "5 m", "m5", "1e3s", "--5s"])
def test_what_is_not_a_duration_is_refused_with_examples(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)
    with pytest.raises(Exception, match=r"\(or a duration: 90s, 5m, 2h30m, 1d\)"):
        DURATION(text)


@pytest.mark.parametrize("text", ["nan", "inf", "-5", "1e3", "\u0663\u0660", "\u0663s"])
def test_a_duration_is_ascii_digits_and_units_only(text):
    # float() takes these; a caller without its own range check got NaN, a negative or 'Arabic' 30
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_a_duration_over_a_day_or_of_nothing_is_out_of_range():
    for text in ("1d1s", "25h", "0s", "0"):
        with pytest.raises(Exception, match="more than 0 and at most 86400 seconds"):
            DURATION(text)


def test_percentages_and_milliseconds():
    assert PERCENT("2%") == 2 and PERCENT("0.5 %") == 0.5 and PERCENT("2") == 2
    with pytest.raises(Exception, match=r"'101%' is not a finite number more than 0 and at most 100 percent"):
        PERCENT("101%")
    with pytest.raises(Exception, match="is not a finite number"):
        PERCENT("2%%")
    assert MILLISECONDS("250ms") == 250 and MILLISECONDS("2s") == 2000 and MILLISECONDS("40") == 40


def test_short_options_and_their_long_names_parse_alike():
    parser = build_parser()
    short = parser.parse_args(["-p", "42", "-d", "5m", "-o", "json", "--budget", "2%", "--no-folder"])
    long = parser.parse_args(["--pid", "42", "--duration", "300", "--format", "json", "--budget", "2", "--no-folder"])
    assert vars(short) == vars(long)
    assert short.pid == 42 and short.duration == 300 and short.format == "json" and short.budget == 2
    probe = parser.parse_args(["probe", "memleak", "-p", "7", "-d", "1m", "-o", "json"])
    assert (probe.pid, probe.duration, probe.format) == (7, 60, "json")
    assert parser.parse_args(["probe", "faults", "--json"]).format == "json"  # the older spelling stays
    verify = parser.parse_args(["verify", "--baseline", "x", "-p", "9", "-d", "2h30m"])
    assert (verify.pid, verify.duration) == (9, 9000)
    serve = parser.parse_args(["serve", "--duration", "5m", "--budget", "1%", "--dedupe-window", "4h"])
    assert (serve.duration, serve.budget, serve.dedupe_window) == (300, 1, 14400)


def test_version_is_the_package_metadata_s():
    r = run("--version")
    assert r.returncode == 0 and r.stdout == f"memdiag {memdiag_version()}\n" and r.stderr == ""
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", memdiag_version())  # not "unknown": the package is installed
    assert run("-V").stdout == r.stdout


def test_bare_memdiag_prints_usage_and_starts_nothing(tmp_path):
    r = subprocess.run([MEMDIAG], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("usage: memdiag -p PID | --cgroup PATH | --container ID|NAME | --system")
    assert "memdiag -p 1234 -o json | jq .verdict.kind" in r.stderr and "--system -d 1m" in r.stderr
    assert list(tmp_path.iterdir()) == []  # no report folder made


def test_options_without_a_target_are_one_line(tmp_path):
    r = subprocess.run([MEMDIAG, "-d", "5s"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr == (
        "memdiag: name a target: -p PID, --cgroup PATH, --container ID|NAME, or --system for the whole system\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_no_folder_and_output_together_are_refused():
    r = run("-p", str(os.getpid()), "--no-folder", "--output", "/tmp/x")
    assert r.returncode == 2 and r.stderr == "memdiag: --no-folder and --output: choose one\n"


def test_a_bad_format_is_one_line():
    r = run("-p", "1", "-o", "xml")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1
    assert "argument -o/--format: invalid choice: 'xml' (choose from 'text', 'json')" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["probe", "memleak"], "probe memleak traces the user-space allocations of a process or cgroup: give -p PID"),
        (["probe", "reach"], "probe reach scans one process's memory"),
        (["probe", "jfr", "--cgroup", "/"], "probe jfr records one JVM: give -p PID"),
        (["probe", "goheap"], "probe goheap reads one Go process: give -p PID"),
        (["probe", "sites", "--function", "f"], "probe sites traces one process's calls: give -p PID"),
    ],
)
def test_a_probe_without_the_target_it_needs_exits_2_with_one_line(args, message):
    r = run(*args)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"memdiag: {message}") and len(r.stderr.splitlines()) == 1, r.stderr


def test_a_closed_pipe_ends_quietly_with_0():
    """`memdiag rules list | head -1`, through a real pipe whose reader closes after one line."""
    script = f"set -o pipefail; {MEMDIAG} rules list --facts | head -1"
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 1 and r.stdout.split()[0] in FACTS
    assert r.stderr == ""
    # and the reader gone before anything was written (stdout closed): still 0, still quiet
    proc = subprocess.Popen([MEMDIAG, "rules", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_an_80_column_terminal_and_shows_examples_and_exit_codes(command):
    env = {**os.environ, "COLUMNS": "80"}
    r = run(*([command] if command else []), "--help", env=env)
    assert r.returncode == 0, r.stderr
    long = [line for line in r.stdout.splitlines() if len(line) > 80]
    assert long == []
    assert "examples:\n  memdiag " in r.stdout and "exit status:\n  0 " in r.stdout
    assert "``" not in r.stdout  # no RST markup
    if command:  # the description: the command's whole summary, wrapped, never cut
        summary = r.stdout.split("\n\n")[1]
        said = _commands()[command].SUMMARY
        assert " ".join(summary.split()) == said[0].upper() + said[1:] + "."


def test_commands_are_summed_up_whole_in_the_main_help():
    r = run("--help", env={**os.environ, "COLUMNS": "200"})
    for line in ("top        ", "probe      ", "verify     "):
        assert line.strip() in r.stdout
    assert "compile the BPF programs for this kernel and measure uprobe costs (set-up runs it)" in r.stdout
    assert "diagnose a service again after a fix and compare with an earlier report" in r.stdout


def test_probe_help_lists_every_probe_with_its_face_s_summary():
    r = run("probe", "--help", env={**os.environ, "COLUMNS": "200"})
    listed = r.stdout.split("probes:\n", 1)[1].split("\n\n", 1)[0]
    names = [line.split()[0] for line in listed.splitlines() if not line.startswith("     ")]
    assert names == REGISTRY.cli_names()
    flat = " ".join(listed.split())
    for name, summary in REGISTRY.summaries().items():
        assert summary and f"{name} {summary}" in flat, name
    assert "{brkstack," not in r.stdout  # the choices are not dumped as a set


def test_exit_codes_by_verdict_are_opt_in_and_tabled():
    parser = build_parser()
    assert parser.parse_args(["-p", "1"]).exit_code is False
    assert parser.parse_args(["-p", "1", "--exit-code"]).exit_code is True
    assert VERDICT_EXIT_CODES == {"leak": 3, "growth": 4, "inconclusive": 5, "oom": 6, "pressure": 7}
    r = run("--help", env={**os.environ, "COLUMNS": "80"})
    assert "3 leak, 4 growth, 5 inconclusive, 6 oom, 7 pressure" in r.stdout
    from memdiag.diagnose.report import VerdictKind

    kinds = set(VerdictKind.__args__)
    assert set(VERDICT_EXIT_CODES) | {"healthy", "cache"} == kinds  # every verdict has its code (0 or listed)
    assert not set(VERDICT_EXIT_CODES.values()) & {0, 1, 2, 130, 143}
