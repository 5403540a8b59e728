"""BENCHMARKS.md's accuracy section: every incident of the labelled corpus (bench/accuracy/corpus.yaml)
run RUNS times with memdiag's defaults, as a user runs it (`memdiag --pid PID` or `--cgroup PATH`,
nothing tuned), each report.json judged against its label (scripts/accuracy_score.py counts).

`scripts/bench.sh --only accuracy` runs the whole corpus (BENCH_RUNS times, default 3) and rewrites
the section. `--runs N` and `--incident NAME` (repeatable) run less: such a run prints its table and
writes the outcomes (--outcomes FILE, JSON) but never BENCHMARKS.md, which shows full runs only.
Every program started is stopped and every cgroup, swap file and file it made removed, also when a
run fails (the kit's helpers)."""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accuracy_score import Outcome, judge, label_of, load_corpus, render, score
from bench_common import BCC_ENV, RUNS, MiB
from jvmkit import wait_warmed_up
from kit import BUILD, CFLAGS, MEMDIAG, PYTHON, MemoryCgroup, Workload, _made_once, swapfile, wait_until
from memdiag.system import arch

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "bench" / "accuracy" / "programs"
ALLOCATORS = {
    "jemalloc": "libjemalloc.so.2",
    "tcmalloc": "libtcmalloc_minimal.so.4",
    "mimalloc": "libmimalloc.so.2",
}
JAVA_HOME = Path(os.environ.get("MEMDIAG_TEST_JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"))
MEMDIAG_TIMEOUT_S = 180


def _digest(*parts: bytes) -> str:
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def build(program: str) -> list[str]:
    """The argv prefix that runs a corpus program, built once per source content under .build."""
    src = PROGRAMS / program
    out_dir = BUILD / "accuracy"
    if program.endswith((".c", ".cc")):
        compiler = "cc" if program.endswith(".c") else "c++"
        stem = src.name.rsplit(".", 1)[0]
        out = out_dir / _digest(src.read_bytes(), (PROGRAMS / "acc.h").read_bytes()) / stem
        _made_once(out, lambda tmp: subprocess.run([compiler, *CFLAGS, "-o", str(tmp), str(src)], check=True))
        return [str(out)]
    if program.endswith(".rs"):
        out = out_dir / _digest(src.read_bytes()) / src.stem
        flags = ["-C", "opt-level=1", "-g", "-C", "force-frame-pointers=yes"]
        _made_once(out, lambda tmp: subprocess.run(["rustc", *flags, "-o", str(tmp), str(src)], check=True))
        return [str(out)]
    if program.endswith(".py"):
        return [PYTHON, str(src)]
    if program.endswith(".js"):
        return [shutil.which("node") or "node", str(src)]
    if program.startswith("go/"):
        module = PROGRAMS / "go"
        name = program.split("/", 1)[1]
        sources = [module / "go.mod", *sorted((module / name).glob("*.go"))]
        out = out_dir / _digest(*(p.read_bytes() for p in sources)) / name
        env = {
            **os.environ,
            "GOCACHE": str(BUILD / "gocache"),
            "GOPATH": str(BUILD / "gopath"),
            "GOFLAGS": "-buildvcs=false",
            "GOPROXY": "off",
            "GOTOOLCHAIN": "local",
        }
        _made_once(
            out,
            lambda tmp: subprocess.run(["go", "build", "-o", str(tmp), f"./{name}"], cwd=module, env=env, check=True),
        )
        return [str(out)]
    if program.startswith("java/"):
        sources = sorted((PROGRAMS / "java").glob("*.java"))
        classes = out_dir / _digest(*(p.read_bytes() for p in sources)) / "classes"

        def javac(tmp: Path) -> None:
            tmp.mkdir(parents=True)
            subprocess.run([str(JAVA_HOME / "bin" / "javac"), "-g", "-d", str(tmp), *map(str, sources)], check=True)

        _made_once(classes, javac)
        return [str(JAVA_HOME / "bin" / "java"), "-cp", str(classes), Path(program).stem]
    raise ValueError(f"no way to build {program}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Program(Workload):
    """A corpus program (or a program of the distribution) as a real process, in its cgroup if any;
    ready when it prints its ready line, or (a command) when its port or socket accepts."""

    def __init__(self, argv: list[str], cgroup: MemoryCgroup | None, env: dict | None, ready: str | None):
        self.argv, self.cgroup, self.env, self.cwd, self.proc = argv, cgroup, env, None, None
        self.wait_for = ready

    def start(self) -> Program:
        if self.wait_for is None:
            super().start()
            return self
        procs_file = self.cgroup.procs_file if self.cgroup else None

        def enter_cgroup() -> None:
            if procs_file is not None:
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))

        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=enter_cgroup,
            env={**os.environ, **(self.env or {})},
        )
        try:
            wait_until(self._accepts, f"{self.argv[0]} accepting on {self.wait_for}", timeout=30)
        except BaseException:
            self.stop()
            raise
        return self

    def _accepts(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.argv} exited with {self.proc.returncode}")
        kind, _, where = self.wait_for.partition(":")
        family, address = (socket.AF_UNIX, where) if kind == "socket" else (socket.AF_INET, ("127.0.0.1", int(where)))
        with socket.socket(family) as s:
            try:
                s.connect(address)
            except OSError:
                return False
        return True


def _fill(values: list[str], subst: dict[str, str]) -> list[str]:
    return [v.format(**subst) for v in values]


def run_once(incident: dict, out_dir: Path) -> Outcome:
    """One run of one incident: its program started as the corpus says, memdiag with its defaults,
    the report judged; everything it started or made stopped and removed before returning."""
    label = label_of(incident)
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="acc-", dir="/var/tmp"))
        stack.callback(shutil.rmtree, tmp, True)
        subst = {"tmp": str(tmp), "port": str(_free_port())}
        if incident.get("swap_mib"):
            stack.enter_context(swapfile(incident["swap_mib"] * MiB))
        cg = None
        if "cgroup" in incident:
            spec = incident["cgroup"]
            limit = spec.get("limit_mib")
            cg = stack.enter_context(MemoryCgroup(limit * MiB if limit else None, swap=spec.get("swap", True)))
        env = None
        allocator = incident.get("allocator", "glibc")
        if allocator != "glibc":
            library = arch.library(ALLOCATORS[allocator])
            if not os.path.exists(library):  # the loader would warn and run the program on glibc's malloc
                raise SystemExit(f"accuracy: {incident['name']} needs {library} (scripts/setup.sh --test installs it)")
            env = {"LD_PRELOAD": library}
        if "command" in incident:
            argv = _fill(incident["command"], subst)
            ready = incident["ready"].format(**subst)
            ready = f"port:{subst['port']}" if ready == "port" else ready
        else:
            argv, ready = build(incident["program"]) + _fill([str(a) for a in incident.get("args", [])], subst), None
        program = Program(argv, cg, env, ready).start()
        stack.callback(_clean, incident.get("clean", []), program)
        stack.callback(program.stop)
        if "client" in incident:
            c = incident["client"]
            client = Program(build(c["program"]) + _fill([str(a) for a in c.get("args", [])], subst), None, None, None)
            stack.enter_context(client)
        if incident.get("jvm_warm"):
            wait_warmed_up(program.pid)
        time.sleep(incident.get("settle_s", 0))
        subst |= {"pid": str(program.pid), "cgroup": cg.path if cg else ""}
        target = ["--cgroup", cg.path] if incident.get("target") == "cgroup" and cg else ["--pid", str(program.pid)]
        t0 = time.monotonic()
        done = subprocess.run(
            [MEMDIAG, *target, "--output", str(out_dir), "--quiet"],
            capture_output=True,
            text=True,
            timeout=MEMDIAG_TIMEOUT_S,
            env=BCC_ENV,
        )
        took = time.monotonic() - t0
    report_file = out_dir / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else None
    if report is None:
        why = f"no report (exit {done.returncode}): {done.stderr[-300:]}"
        print(f"accuracy: {incident['name']}: {why}", file=sys.stderr)
    return judge(incident["name"], label, report, took, subst)


def _clean(globs: list[str], program: Program) -> None:
    """Files the program left behind (its own names, by its pid)."""
    if program.proc is None:
        return
    for pattern in globs:
        for path in glob.glob(pattern.format(pid=program.proc.pid)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def run_corpus(runs: int, names: list[str] | None, keep: Path | None) -> tuple[list[Outcome], list[dict]]:
    incidents = load_corpus()
    if names:
        unknown = set(names) - {i["name"] for i in incidents}
        if unknown:
            print(f"accuracy: no incident named {', '.join(sorted(unknown))}", file=sys.stderr)
            raise SystemExit(2)
        incidents = [i for i in incidents if i["name"] in names]
    outcomes = []
    for run in range(runs):
        for inc in incidents:
            out = Path(tempfile.mkdtemp(prefix=f"acc-{inc['name']}-", dir=keep)) if keep else None
            with contextlib.ExitStack() as stack:
                if out is None:
                    out = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="acc-report-")))
                o = run_once(inc, out)
            outcomes.append(o)
            named = "named" if o.named else ("–" if not o.label.has_culprit else "NOT named")
            print(
                f"accuracy: run {run + 1}/{runs} {inc['name']}: label {o.label.kind}, verdict {o.kind} "
                f"({o.rule}), culprit {named}, {o.seconds:.0f} s",
                flush=True,
            )
    return outcomes, incidents


def accuracy_section(argv: list[str] | None = None) -> list[str] | None:
    """Run the corpus (argv: --runs, --incident, --outcomes, --keep-reports); the section's lines for
    BENCHMARKS.md from a full run, None from a partial one (its table printed instead)."""
    p = argparse.ArgumentParser(prog="bench.sh --only accuracy")
    p.add_argument("--runs", type=int, default=RUNS, help="runs of each incident (default BENCH_RUNS, 3)")
    p.add_argument("--incident", action="append", help="run only this incident (repeatable)")
    p.add_argument("--outcomes", type=Path, help="write every run's outcome here (JSON)")
    p.add_argument("--keep-reports", type=Path, help="keep each run's report folder under this folder")
    a = p.parse_args(argv or [])
    if a.runs < 1:
        p.error("--runs must be at least 1")
    outcomes, incidents = run_corpus(a.runs, a.incident, a.keep_reports)
    if a.outcomes:
        a.outcomes.write_text(
            json.dumps(
                [
                    {
                        "incident": o.incident,
                        "label": o.label.kind,
                        "accepted": list(o.label.accepted),
                        "kind": o.kind,
                        "named": o.named,
                        "has_culprit": o.label.has_culprit,
                        "seconds": round(o.seconds, 1),
                        "rule": o.rule,
                        "summary": o.summary,
                    }
                    for o in outcomes
                ],
                indent=1,
            )
        )
    lines = render(score(outcomes), outcomes, a.runs, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    if a.incident or a.runs < 3:
        print("\n".join(lines))
        print("accuracy: a partial run (a subset or fewer than 3 runs): BENCHMARKS.md left as it is")
        return None
    return lines
