"""Hostile rule files through the real CLI: each is refused in one line, fast, in little memory,
never hangs; the working folder's playbooks/ never reaches a verdict; the site folder is policy
only when it is owned and not writable by others. Each memdiag is a grandchild whose own peak RSS
is read from wait4."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from kit import MEMDIAG

MiB = 1 << 20
SMALL_RSS = 100 * MiB  # memdiag itself starts at ~50 MiB; the billion-laughs file once took 580 MiB
FORGED = (
    "rules:\n"
    "  - id: forged-all-clear\n"
    "    description: whatever happens, all is well\n"
    "    when: process.rss >= 0\n"
    "    then:\n"
    "      verdict: {kind: healthy, summary: 'all clear, nothing to see', confidence: 1.0, priority: 100000}\n"
)
SITE_RULE = (
    "rules:\n"
    "  - id: site-anon-ceiling\n"
    "    description: our services stay under 4 GiB of anonymous memory\n"
    "    when: process.rss_anon > 4GiB\n"
    "    then: {finding: 'over the site ceiling'}\n"
)


class Ran:
    def __init__(self, rc: int, out: str, err: str, seconds: float, peak_rss: int):
        self.returncode, self.stdout, self.stderr, self.seconds, self.peak_rss = rc, out, err, seconds, peak_rss


# memdiag's own peak RSS: a child forked (or vforked) by pytest inherits pytest's RSS high-water
# mark in ru_maxrss across exec, so a test that made pytest big once made every memdiag here look
# big. A small launcher forks memdiag and reports the grandchild's rusage, which starts clean.
LAUNCHER = (
    "import os, sys\n"
    "fd = int(sys.argv[1])\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.close(fd)\n"
    "    os.execv(sys.argv[2], sys.argv[2:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "os.write(fd, str(usage.ru_maxrss).encode())\n"
    "sys.exit(os.waitstatus_to_exitcode(status))\n"
)


def run(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 10) -> Ran:
    """memdiag as a grandchild (see LAUNCHER); its own peak RSS from wait4."""
    rss_r, rss_w = os.pipe()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", LAUNCHER, str(rss_w), MEMDIAG, *args],
            stdout=out,
            stderr=err,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            pass_fds=(rss_w,),
            start_new_session=True,  # a timeout kills memdiag too
        )
        os.close(rss_w)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            pytest.fail(f"memdiag {' '.join(args)} still running after {timeout} s")
        finally:
            with os.fdopen(rss_r, "rb") as f:
                peak = f.read()
        seconds = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        return Ran(proc.returncode, out.read().decode(), err.read().decode(), seconds, int(peak or 0) * 1024)


def _owned_folder(path: Path, mode: int = 0o755) -> Path:
    path.mkdir()
    path.chmod(mode)
    return path


def _file(folder: Path, name: str, text: str, mode: int = 0o644) -> Path:
    p = folder / name
    p.write_text(text)
    p.chmod(mode)
    return p


def _billion_laughs(folder: Path) -> Path:
    lines = ['rules:\n  - &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n']
    lines += [f"  - &a{i} [{','.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 10)]
    return _file(folder, "laughs.yaml", "".join(lines))


def _fifo(folder: Path) -> Path:
    p = folder / "fifo.yaml"
    os.mkfifo(p, 0o644)
    return p


def _fifty_megabytes(folder: Path) -> Path:
    p = folder / "big.yaml"
    with p.open("wb") as f:
        f.write(b"rules:\n")
        for i in range(50 * 1024):  # 50 MB of valid-looking rules, not just blanks
            f.write(
                f"  - {{id: r{i}, description: d, when: process.rss > 1GiB, then: {{finding: x}}}}\n".ljust(
                    1024
                ).encode()
            )
    p.chmod(0o644)
    return p


def _alias_bytes(folder: Path) -> Path:
    """100 KB that repeat a 60 KB id 3000 times: once 180 MB of text and a gigabyte of error lines."""
    return _file(folder, "repeat.yaml", 'rules:\n  - {id: &s "' + "y" * 60_000 + '"}\n' + "  - {id: *s}\n" * 3000)


def _base_60(folder: Path) -> Path:
    """One YAML 1.1 base-60 int of 1 MiB: 24 s of CPU to build."""
    return _file(folder, "base60.yaml", "rules:\n  - id: 1" + ":59" * 349_000 + "\n")


def _bool_maybe(folder: Path) -> Path:
    return _file(folder, "maybe.yaml", "rules:\n  - id: !!bool maybe\n")


HANG_S = 10


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        (_billion_laughs, ":6: alias `*a3` expands the file past 10000 nodes (a YAML alias bomb?)"),
        (lambda _: Path("/dev/zero"), "/dev/zero: a character device, not a regular file"),
        (_fifo, "fifo.yaml: a FIFO, not a regular file"),
        (_fifty_megabytes, f"big.yaml: larger than the 1 MiB limit for a rule file ({50 * MiB + 7} bytes)"),
        (_alias_bytes, "repeat.yaml:20: alias `*s` expands the file past 1 MiB (a YAML alias bomb?)"),
        (_base_60, f"base60.yaml:2: a scalar of {1 + 3 * 349_000} characters; at most 65536"),
        (_bool_maybe, "maybe.yaml:2: `maybe` is not a valid bool (tagged !!bool)"),
        (lambda _: Path("/proc/kmsg"), "/proc/kmsg: a file of procfs (a kernel interface), not a rule file; refused"),
    ],
    ids=["billion-laughs", "dev-zero", "fifo", "50MB", "alias-bytes", "base-60", "bool-maybe", "proc-kmsg"],
)
def test_hostile_playbook_is_refused_in_one_line_fast_and_small(root_required, tmp_path, make, expect):
    path = make(_owned_folder(tmp_path / "book"))
    r = run("--pid", str(os.getpid()), "--duration", "3", "--playbook", str(path), "--output", str(tmp_path / "out"))
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"memdiag: bad rule file: {path}") and expect in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    # not a timing test: a bomb that got through runs for minutes; memdiag starts in ~0.4 s, and a
    # loaded CI machine must not fail a refusal that took a few seconds
    assert r.seconds < HANG_S, r.seconds
    assert r.peak_rss < SMALL_RSS, r.peak_rss
    assert not (tmp_path / "out").exists()  # refused before anything was started
    lint = run("rules", "check", str(path))  # linting reads it the same bounded way
    assert lint.returncode == 2 and expect in lint.stderr and lint.seconds < HANG_S and lint.peak_rss < SMALL_RSS


def test_the_working_folders_playbooks_cannot_forge_a_verdict(workload, tmp_path):
    """A well-owned ./playbooks/ is still not policy: only what is named or installed is."""
    w = workload("leak", "8192")
    here = _owned_folder(tmp_path / "here")
    forged = _file(_owned_folder(here / "playbooks"), "forged.yaml", FORGED)
    r = run("--pid", str(w.pid), "--duration", "3", "--output", str(tmp_path / "plain"), cwd=here, timeout=180)
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "plain" / "report.json").read_text()
    verdict = json.loads(report)["verdict"]
    assert verdict["kind"] in ("leak", "growth"), verdict
    for name in ("report.json", "report.md", "report.html"):
        text = (tmp_path / "plain" / name).read_text()
        assert "forged-all-clear" not in text and "all clear, nothing to see" not in text, name
    # the control: the same file, named, is loaded and wins, so the check above could fail
    r = run(
        *("--pid", str(w.pid), "--duration", "3", "--output", str(tmp_path / "named")),
        *("--playbook", str(forged)),
        cwd=here,
        timeout=180,
    )
    assert r.returncode == 0, r.stderr
    named = json.loads((tmp_path / "named" / "report.json").read_text())
    assert named["verdict"]["kind"] == "healthy" and named["verdict"]["summary"] == "all clear, nothing to see"


def test_the_site_folder_is_policy_only_when_owned_and_closed(root_required, tmp_path):
    site = _owned_folder(tmp_path / "site", 0o777)
    rule = _file(site, "ceiling.yaml", SITE_RULE)
    env = {"MEMDIAG_PLAYBOOK_DIR": str(site)}
    r = run("rules", "list", env=env)
    assert r.returncode == 2
    assert r.stderr == (
        f"memdiag: bad rule file: {site}: not trusted policy: {site} is writable by group and others "
        f"(mode 0777); fix: chmod go-w {site}\n"
    )
    r = run("--pid", str(os.getpid()), "--duration", "1", "--output", str(tmp_path / "out"), env=env)
    assert r.returncode == 2 and "not trusted policy" in r.stderr and r.stderr.count("\n") == 1
    site.chmod(0o755)
    r = run("rules", "list", env=env)
    assert r.returncode == 0, r.stderr
    assert f"site-anon-ceiling                  {rule}:2" in r.stdout
    rule.chmod(0o646)
    r = run("rules", "list", env=env)
    assert r.returncode == 2 and f"{rule} is writable by others (mode 0646); fix: chmod go-w {rule}" in r.stderr
    os.chown(rule, 65534, 65534)
    rule.chmod(0o644)
    r = run("rules", "list", env=env)
    assert r.returncode == 2 and f"{rule} is owned by uid 65534, not root; fix: chown root {rule}" in r.stderr
    # linting names it, checks it, and says it is not policy
    r = run("rules", "check", str(rule), env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "ok: 1 rules in 1 file(s)",
        f"note: {rule} is not trusted policy ({rule} is owned by uid 65534, not root; fix: chown root {rule}); "
        "a diagnosis would refuse it",
    ]


def test_a_playbook_path_in_a_loose_folder_is_refused_with_the_fix(root_required, tmp_path):
    loose = _owned_folder(tmp_path / "loose", 0o770)
    rule = _file(loose, "site.yaml", SITE_RULE)
    r = run("--pid", str(os.getpid()), "--playbook", str(rule), "--output", str(tmp_path / "out"))
    assert r.returncode == 2
    assert r.stderr == (
        f"memdiag: bad rule file: {rule}: not trusted policy: {loose} is writable by its group (mode 0770); "
        f"fix: chmod go-w {loose}\n"
    )


def test_a_lint_of_thousands_of_errors_prints_fifty_and_a_count(tmp_path):
    bad = _file(_owned_folder(tmp_path / "book"), "bad.yaml", "rules: [" + ",".join(["a"] * 5000) + "]\n")
    r = run("rules", "check", str(bad))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.splitlines()
    assert lines[0] == "memdiag: bad rule files:" and len(lines) == 52, lines[:3]
    assert lines[1] == f"  {bad}:1: rule 0: Input should be a valid dictionary or instance of Rule"
    assert lines[-1] == "  ... and 4950 more"
    assert r.seconds < HANG_S and r.peak_rss < SMALL_RSS, (r.seconds, r.peak_rss)


def test_a_trace_pipe_is_refused_unread_and_its_events_stay(root_required, tmp_path):
    """A tracing instance's trace_pipe: root-owned and regular, so it passed as trusted policy; a
    read took the events from the tracer reading it, or failed with EAGAIN (exit 1)."""
    instance = Path("/sys/kernel/tracing/instances") / f"memdiag-rulefix-{os.getpid()}"
    if not instance.parent.is_dir():
        pytest.skip("no tracefs at /sys/kernel/tracing")
    instance.mkdir()
    try:
        pipe = instance / "trace_pipe"
        (instance / "trace_marker").write_text("kept for its reader\n")
        for args in (("rules", "list", str(pipe)), ("--pid", str(os.getpid()), "--playbook", str(pipe))):
            r = run(*args, "--output", str(tmp_path / "out")) if args[0] == "--pid" else run(*args)
            assert r.returncode == 2, r.stderr
            assert r.stderr == (
                f"memdiag: bad rule file: {pipe}: a file of tracefs (a kernel interface), not a rule file; "
                "refused unread\n"
            )
        fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        try:
            assert b"kept for its reader" in os.read(fd, 1 << 16)  # the event is still there to read
        finally:
            os.close(fd)
    finally:
        instance.rmdir()
