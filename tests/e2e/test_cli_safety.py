"""memdiag runs as root among other users' files and processes: a report folder another user can
write to is refused and a link planted in one is never written through; text a process chose (its
comm) reaches the terminal with its control characters visible; the largest numbers the options
accept are ones the BPF side takes; Ctrl-C during start-up is one line, exit 130.
Real folders owned by nobody, real processes renamed with prctl, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kit import MEMDIAG

NOBODY = 65534
HOSTILE_COMM = b"\x1b[31mRED\n# HEAD"  # 15 bytes: the kernel keeps all of it
SHOWN_COMM = "\\x1b[31mRED\\n# HEAD"  # as memdiag prints it
CHILD = (
    "import ctypes, mmap, sys, time\n"
    f"ctypes.CDLL(None).prctl(15, {HOSTILE_COMM!r}, 0, 0, 0)\n"  # PR_SET_NAME
    "print('ready', flush=True)\n"
    "while True:\n"  # a few MiB touched and let go, so a page-fault probe sees this comm
    "    m = mmap.mmap(-1, 4 << 20)\n"
    "    for i in range(0, 4 << 20, 4096):\n"
    "        m[i] = 1\n"
    "    m.close()\n"
    "    time.sleep(0.05)\n"
)


@pytest.fixture
def hostile():
    """A process whose comm is an ESC sequence with a newline in it."""
    p = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE)
    try:
        assert p.stdout.readline() == b"ready\n"
        assert Path(f"/proc/{p.pid}/comm").read_bytes() == HOSTILE_COMM + b"\n"
        yield p.pid
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def victim(tmp_path):
    """A root-owned 0600 file that no report may overwrite, and a check that none did."""
    path = tmp_path / "victim"
    path.write_text("precious\n")
    path.chmod(0o600)
    yield path
    assert path.read_text() == "precious\n" and not path.is_symlink()


def _plant(folder: Path, name: str, target: Path, owner: int | None = None) -> Path:
    link = folder / name
    link.symlink_to(target)
    if owner is not None:
        os.lchown(link, owner, owner)
    return link


def _refused(r: subprocess.CompletedProcess, expected: str) -> None:
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_report_folder_others_can_write_to_is_refused(memdiag, root_required, workload, tmp_path, victim):
    w = workload("churn", "1000")
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    link = _plant(theirs, ".report.json.tmp", victim, owner=NOBODY)
    r = memdiag("--pid", str(w.pid), "--duration", "1", "--output", str(theirs))
    _refused(r, f"--output {theirs}: refusing a report folder owned by uid 65534")
    assert "name a new folder (memdiag creates it, mode 700) or one owned by root" in r.stderr
    assert link.is_symlink() and os.listdir(theirs) == [".report.json.tmp"]

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # root's, but anyone can add entries (a /tmp)
    _refused(
        memdiag("--pid", str(w.pid), "--duration", "1", "--output", str(shared)),
        f"refusing a report folder others can write to (mode 1777): they could plant links that memdiag would "
        f"write through; run chmod go-w {shared} or name a new folder",
    )
    assert os.listdir(shared) == []

    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    pointer = tmp_path / "pointer"
    pointer.symlink_to(mine)
    _refused(
        memdiag("--pid", str(w.pid), "--duration", "1", "--output", str(pointer)),
        f"--output {pointer}: is a symbolic link; name the folder itself ({mine})",
    )
    assert os.listdir(mine) == []


def test_default_folder_planted_by_another_user_is_refused(root_required, workload, tmp_path, victim):
    """The default name is predictable (time and pid): planted ahead in a world-writable cwd, it is
    refused, not used."""
    w = workload("churn", "1000")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cwd.chmod(0o1777)
    now = time.time()
    for ahead in range(-1, 8):
        planted = cwd / f"memdiag-{time.strftime('%Y%m%d-%H%M%S', time.localtime(now + ahead))}-pid{w.pid}"
        planted.mkdir()
        os.chown(planted, NOBODY, NOBODY)
        _plant(planted, ".report.json.tmp", victim, owner=NOBODY)
    r = subprocess.run(
        [MEMDIAG, "--pid", str(w.pid), "--duration", "1"], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    _refused(r, f"report folder {cwd}/memdiag-")
    assert f"-pid{w.pid}: refusing a report folder owned by uid 65534 (nobody)" in r.stderr


def test_links_planted_in_our_folder_are_replaced_not_followed(memdiag, root_required, workload, tmp_path, victim):
    w = workload("churn", "1000")
    out = tmp_path / "out"
    out.mkdir(mode=0o700)
    _plant(out, ".report.json.tmp", victim)
    _plant(out, "report.md", victim)
    _plant(out, "growth.svg", tmp_path / "missing")  # a dangling one is not created either
    _plant(out, ".profile.pb.gz.tmp", victim)  # a profile is bytes, written the same way
    r = memdiag("--pid", str(w.pid), "--duration", "1", "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(out))
    assert names == ["growth.folded", "growth.svg", "profile.pb.gz", "report.html", "report.json", "report.md"]
    for name in names:
        st = (out / name).lstat()
        assert not (out / name).is_symlink() and st.st_mode & 0o777 == 0o600, name
    assert json.loads((out / "report.json").read_text())["target"]["pid"] == w.pid
    assert (out / "report.md").read_text().startswith("# ")
    assert not (tmp_path / "missing").exists()


def test_new_report_folder_is_owner_only(root_required, workload, tmp_path):
    w = workload("churn", "1000")
    cwd = tmp_path / "cwd"
    cwd.mkdir(mode=0o755)
    r = subprocess.run(
        [MEMDIAG, "--pid", str(w.pid), "--duration", "1", "--quiet"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        preexec_fn=lambda: os.umask(0),  # the mode is memdiag's, not the umask's
    )
    assert r.returncode == 0, r.stderr
    (made,) = cwd.iterdir()
    assert made.name.startswith("memdiag-") and made.name.endswith(f"-pid{w.pid}")
    assert made.stat().st_mode & 0o7777 == 0o700 and made.stat().st_uid == 0
    assert r.stdout.splitlines()[-1] == f"report: {made}/report.md"
    assert {p.stat().st_mode & 0o777 for p in made.iterdir()} == {0o600}


def test_probe_folded_replaces_a_planted_link(memdiag, root_required, hostile, tmp_path, victim):
    folded = _plant(tmp_path, "stacks.folded", victim)
    r = memdiag("probe", "faults", "--pid", str(hostile), "--duration", "1", "--folded", str(folded))
    assert r.returncode == 0, r.stderr
    assert not folded.is_symlink()
    lines = folded.read_text().splitlines()
    assert lines and all(line.rsplit(" ", 1)[1].isdigit() for line in lines)


def _no_raw_controls(r: subprocess.CompletedProcess) -> None:
    for stream in (r.stdout, r.stderr):
        assert "\x1b" not in stream and "RED\n#" not in stream, stream


def test_a_comm_of_escape_sequences_is_printed_visible(memdiag, root_required, hostile, tmp_path):
    r = memdiag("--pid", str(hostile), "--duration", "1", "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r)
    verdict = r.stdout.splitlines()[0]
    assert f"PID {hostile} ({SHOWN_COMM})" in verdict, verdict

    r = memdiag("top", "--once", "--interval", "0.2", "--lines", "100000")
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r)
    (row,) = [line for line in r.stdout.splitlines() if line.split()[0] == str(hostile)]
    assert f"{hostile} {SHOWN_COMM}" in row, row

    r = memdiag("probe", "faults", "--duration", "2", "--top", "100000")  # every process's comm, from BPF
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r)
    assert any(f"PID {hostile:>7} {SHOWN_COMM}" in line for line in r.stdout.splitlines()), r.stdout

    r = memdiag("probe", "faults", "--duration", "2", "--top", "100000", "--json")
    assert r.returncode == 0, r.stderr
    _no_raw_controls(r)
    comms = {p["pid"]: p["comm"] for p in json.loads(r.stdout)["per_process"]}
    assert comms[hostile] == HOSTILE_COMM.decode()  # JSON keeps the value, escaped by JSON's rules


def test_the_largest_accepted_numbers_are_ones_bpf_takes(memdiag, root_required, workload):
    """--sample-every at its bound (a 32-bit modulus) and sizes at theirs (128 PiB) compile and run."""
    w = workload("churn", "1000")
    big = str(2**57)
    r = memdiag(
        "probe", "memleak", "--pid", str(w.pid), "--duration", "1", "--json",
        "--sample-every", str(2**32 - 1), "--min-size", "0", "--max-size", big, "--snoop", big,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["status"] in ("ok", "partial"), r.stdout[:2000]


def _pydantic_loaded(pid: int) -> bool:
    """memdiag's commands are being imported (pydantic's core is mapped): inside main's handlers."""
    try:
        return "_pydantic_core" in Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True


def _entered(pid: int) -> bool:
    """memdiag's console entry has run: it catches SIGTERM (SigCgt bit 15), which Python alone does not."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    caught = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signal.SIGTERM - 1)))


@pytest.mark.parametrize(
    ("when", "sig"), [("imports", signal.SIGINT), ("entry", signal.SIGINT), ("imports", signal.SIGTERM)]
)
def test_ctrl_c_during_start_up_is_one_line(root_required, workload, tmp_path, when, sig):
    """From memdiag's own first line on (before it, the interpreter's own start-up: a SIGINT in its
    site import is Python's fatal error, which a fixed 0.1 s reached on a loaded machine); a SIGTERM
    there too (the lane's emulated start-up took over 25 s: it killed memdiag without a word, -15)."""
    w = workload("churn", "1000")
    p = subprocess.Popen(
        [MEMDIAG, "--pid", str(w.pid), "--duration", "5", "--output", str(tmp_path / "out")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # SIGINT as a terminal's user has it: a suite started in the background (`cmd &` in a
        # script) hands its children SIGINT ignored, and Python then keeps ignoring it (the fresh-
        # clone run started that way exited 0 here, not 130)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        ready = _pydantic_loaded if when == "imports" else _entered
        deadline = time.monotonic() + 10
        while not ready(p.pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + sig, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    (line,) = err.strip().splitlines()
    assert line.startswith("memdiag: interrupted" if sig == signal.SIGINT else "memdiag: terminated"), line
