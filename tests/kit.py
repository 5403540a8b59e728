"""The workload kit: small C programs built with frame pointers and debug info, run as real
processes, optionally inside a real memory cgroup with a real limit, optionally with a real swap
file. Every helper cleans up after itself, also when the test using it fails.

Later issues reuse it: probes and end-to-end scenarios run on the same workloads."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from memdiag.system.cgroup import CgroupLocation

ROOT = Path(__file__).resolve().parent.parent
# The installed console script, as users run it (beside the interpreter running the tests).
MEMDIAG = shutil.which("memdiag", path=str(Path(sys.executable).parent)) or "memdiag"
SOURCES = ROOT / "tests" / "workloads"
BUILD = ROOT / ".build" / "workloads"
CFLAGS = ["-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Werror"]
PYTHON = "/usr/bin/python3.11"  # Debian's CPython, for the workloads written in Python (NAME.py)
GO_SOURCES = SOURCES / "go"  # one Go module, a package per program
GO_ENV = {
    **os.environ,
    "GOCACHE": str(BUILD / "gocache"),
    "GOPATH": str(BUILD / "gopath"),
    "GOFLAGS": "-buildvcs=false",
    "GOPROXY": "off",  # the programs import the standard library only
    "GOTOOLCHAIN": "local",
}


def wait_for_line(proc: subprocess.Popen, wanted: str, timeout: float = 60) -> str:
    """Read a child's stderr up to the line `wanted` (a readiness line it prints, e.g. `memdiag probe
    NAME: attached`) and return what was read. Byte by byte, so nothing past that line is taken
    from what communicate() reads later; AssertionError at the timeout or if stderr closes first."""
    fd, line = proc.stderr.fileno(), ("\n" + wanted + "\n").encode()
    seen = b"\n"
    deadline = time.monotonic() + timeout
    while not seen.endswith(line):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {wanted!r} within {timeout:g} s; stderr so far: {seen[1:].decode()!r}")
        byte = os.read(fd, 1)
        if not byte:
            raise AssertionError(f"stderr closed before {wanted!r}: {seen[1:].decode()!r}")
        seen += byte
    return seen[1:].decode()


def wait_until(ready: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll a readiness condition (every 0.1 s) instead of sleeping a guessed time; fail naming it.
    What it returned once true."""
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not ready after {timeout:.0f} s: {what}")
        time.sleep(0.1)
    return value


def swapped_bytes(pid: int) -> int:
    """VmSwap of a process (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((x for x in text.splitlines() if x.startswith("VmSwap:")), "VmSwap: 0 kB")
    return int(line.split()[1]) * 1024


def build(name: str, extra_flags: list[str] | None = None) -> Path:
    """Compile tests/workloads/NAME.c or NAME.cc, the Rust program NAME.rs (build_rust), or the Go
    program tests/workloads/go/NAME (once per source content and flags); the binary."""
    if (GO_SOURCES / name).is_dir():
        return build_go(name, extra_flags or [])
    if (SOURCES / f"{name}.rs").exists():
        return build_rust(name, extra_flags or [])
    src = SOURCES / f"{name}.c"
    compiler = "cc"
    if not src.exists():
        src, compiler = SOURCES / f"{name}.cc", "c++"
    flags = CFLAGS + (extra_flags or [])
    digest = hashlib.sha256(src.read_bytes() + (SOURCES / "common.h").read_bytes() + " ".join(flags).encode())
    # One folder per build, so the binary keeps its own name (and comm) for the tests to look for.
    out = BUILD / digest.hexdigest()[:12] / name
    return _made_once(out, lambda tmp: subprocess.run([compiler, *flags, "-o", str(tmp), str(src)], check=True))


def _made_once(out: Path, make: Callable[[Path], object]) -> Path:
    """out, made once by make(tmp) into a file of this process's own and moved in whole: two test
    processes building the same program at once (a fresh checkout) each make a whole one, and
    neither runs the other's half-written file."""
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        make(tmp)
        os.replace(tmp, out)
    return out


def build_rust(name: str, flags: list[str]) -> Path:
    """rustc -O of tests/workloads/NAME.rs (scripts/setup.sh --test installs rustc and lld): a release
    build as Rust ships them, without frame pointers, its symbols kept, linked by LLVM's lld as
    rustc >= 1.90 does by default (its code starts inside the page its read-only data ends in)."""
    src = SOURCES / f"{name}.rs"
    cmd = ["rustc", "-O", "--edition", "2021", "-C", "link-arg=-fuse-ld=lld", *flags]
    digest = hashlib.sha256(src.read_bytes() + " ".join(cmd).encode()).hexdigest()[:12]
    out = BUILD / digest / name
    return _made_once(out, lambda tmp: subprocess.run([*cmd, "-o", str(tmp), str(src)], check=True))


def build_library(name: str) -> Path:
    """Compile tests/workloads/NAME.c as a shared object, libNAME.so (once per source), for a
    workload to load (ctypes)."""
    src = SOURCES / f"{name}.c"
    flags = [*CFLAGS, "-shared", "-fPIC"]
    digest = hashlib.sha256(src.read_bytes() + " ".join(flags).encode()).hexdigest()[:12]
    out = BUILD / digest / f"lib{name}.so"
    return _made_once(out, lambda tmp: subprocess.run(["cc", *flags, "-o", str(tmp), str(src)], check=True))


def build_go(name: str, flags: list[str]) -> Path:
    """`go build FLAGS` of the package tests/workloads/go/NAME with the Go toolchain on PATH
    (Debian's golang-go: scripts/setup.sh --test installs it), its caches under .build."""
    digest = hashlib.sha256(" ".join(flags).encode() + go_version().encode() + name.encode())
    for path in [GO_SOURCES / "go.mod", *sorted(GO_SOURCES.rglob("*.go"))]:  # its package and the shared kit
        digest.update(str(path.relative_to(GO_SOURCES)).encode() + path.read_bytes())
    out = BUILD / digest.hexdigest()[:12] / name
    return _made_once(
        out,
        lambda tmp: subprocess.run(
            ["go", "build", *flags, "-o", str(tmp), f"./{name}"], cwd=GO_SOURCES, env=GO_ENV, check=True
        ),
    )


@functools.lru_cache(maxsize=1)
def go_version() -> str:
    """The toolchain's version as its binaries record it (go1.19.8)."""
    out = subprocess.run(["go", "env", "GOVERSION"], env=GO_ENV, capture_output=True, text=True, check=True)
    return out.stdout.strip()


class Workload:
    """A running workload process. ``with Workload("leak", "2048") as w: w.pid``."""

    ready = "ready"  # how the first line the workload prints starts, once it is ready

    def __init__(
        self,
        name: str,
        *args: str,
        cgroup: MemoryCgroup | None = None,
        env: dict | None = None,
        flags: list[str] | None = None,
    ):
        python, script = SOURCES / f"{name}.py", SOURCES / f"{name}.js"
        self.cwd: Path | None = None
        if python.exists():
            # a Python workload runs under Debian's interpreter (always installed), never a pyenv build
            self.binary = Path(PYTHON)
            self.argv = [PYTHON, str(python), *args]
        elif script.exists():  # a Node program: flags are node's own (--perf-basic-prof)
            self.binary = Path(shutil.which("node") or "node")
            self.argv = [str(self.binary), *(flags or []), str(script), *args]
            self.cwd = BUILD / "node"  # --perf-basic-prof writes V8's isolate-*-v8.log in the working folder
            self.cwd.mkdir(parents=True, exist_ok=True)
        else:
            self.binary = build(name, flags)
            self.argv = [str(self.binary), *args]
        self.cgroup = cgroup
        self.env = env
        self.proc: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Workload:
        procs_file = self.cgroup.procs_file if self.cgroup else None

        def enter_cgroup() -> None:  # runs in the child between fork and exec
            if procs_file is not None:
                with open(procs_file, "w") as f:
                    f.write(str(os.getpid()))

        self.proc = subprocess.Popen(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            preexec_fn=enter_cgroup,
            env={**os.environ, **(self.env or {})},
            cwd=self.cwd,
        )
        line = self.proc.stdout.readline().decode()  # type: ignore[union-attr]
        if not line.startswith(self.ready):
            self.stop()
            raise RuntimeError(f"workload {self.argv} did not start: {line!r}")
        return self

    def wait_exit(self, timeout: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc is not None and self.proc.stdout:
            self.proc.stdout.close()
        if self.proc is not None and self.cwd is not None:  # what node --perf-basic-prof leaves behind
            Path(f"/tmp/perf-{self.proc.pid}.map").unlink(missing_ok=True)
            for log in self.cwd.glob(f"isolate-*-{self.proc.pid}-v8.log"):
                log.unlink(missing_ok=True)

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class BenchAlloc(Workload):
    """bench_alloc at a set rate (0: flat out), its once-a-second report collected: (time, ns per
    operation, operations, CPU ns per operation). The target's own clocks judge what tracing cost
    it: the wall clock (its throughput; on a busy machine other processes' CPU shows there too) or
    its thread's CPU clock (traps are charged to it, others' use of the CPUs is not)."""

    def __init__(self, rate: int, leak_kib: int = 256, env: dict | None = None):
        super().__init__("bench_alloc", str(rate), str(leak_kib), env=env)
        self.samples: list[tuple[float, float, int, float]] = []

    def start(self) -> BenchAlloc:
        super().start()
        threading.Thread(target=self._read, daemon=True).start()
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            parts = line.decode().split()
            if len(parts) == 6 and parts[0] == "ns_per_op":
                self.samples.append((time.monotonic(), float(parts[1]), int(parts[3]), float(parts[5])))

    def _lines(self, t0: float, t1: float, cpu: bool) -> list[tuple[float, int]]:
        # a line printed at T covers the second before T
        return [(c if cpu else ns, n) for t, ns, n, c in self.samples if t0 < t <= t1 + 1.0]

    def ns_per_op(self, t0: float, t1: float, cpu: bool = False) -> float | None:
        lines = self._lines(t0, t1, cpu)
        ops = sum(n for _, n in lines)
        return sum(ns * n for ns, n in lines) / ops if ops else None

    def per_second(self, t0: float, t1: float, cpu: bool = False) -> list[float]:
        """Its cost per operation, one figure a second, between t0 and t1."""
        return [ns for ns, n in self._lines(t0, t1, cpu) if n]

    def lost_ns(self, t0: float, t1: float, base_ns_per_op: float, cpu: bool = False) -> float:
        """Time its operations took beyond the untraced cost per operation, between t0 and t1."""
        return sum((ns - base_ns_per_op) * n for ns, n in self._lines(t0, t1, cpu))


def memory_cgroup_root() -> tuple[int, Path]:
    """(version, mount point) of the hierarchy that carries the memory controller here."""
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists() or (v1 / "memory.usage_in_bytes").exists():
        return 1, v1
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        controllers = candidate / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            return 2, candidate
    raise RuntimeError("no memory cgroup controller mounted")


class MemoryCgroup:
    """A real memory cgroup with a limit; removed on exit after killing whatever is left in it."""

    def __init__(self, limit_bytes: int | None, swap: bool = True, name: str | None = None):
        self.version, self.mount = memory_cgroup_root()
        self.name = name or f"memdiag-test-{uuid.uuid4().hex[:8]}"
        self.fs_path = self.mount / self.name
        self.path = "/" + self.name  # path inside the hierarchy, as /proc/PID/cgroup shows it
        self.limit = limit_bytes
        self.swap = swap

    @property
    def procs_file(self) -> Path:
        return self.fs_path / "cgroup.procs"

    @property
    def location(self) -> CgroupLocation:
        """Where it is, as the readers and a cgroup target (Target.for_cgroup) name it."""
        return CgroupLocation(
            version=self.version, path=self.path, fs_path=str(self.fs_path), mount_point=str(self.mount)
        )

    def __enter__(self) -> MemoryCgroup:
        self.fs_path.mkdir()
        try:
            if self.limit is not None:
                if self.version == 1:
                    (self.fs_path / "memory.limit_in_bytes").write_text(str(self.limit))
                else:
                    (self.fs_path / "memory.max").write_text(str(self.limit))
                    if not self.swap:
                        (self.fs_path / "memory.swap.max").write_text("0")
            if self.version == 1 and not self.swap:
                (self.fs_path / "memory.swappiness").write_text("0")
        except BaseException:
            self.__exit__()
            raise
        return self

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except FileNotFoundError:
            return []

    def oom_kills(self) -> int:
        """The OOM kills this cgroup has recorded (v1 memory.oom_control, v2 memory.events)."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.fs_path / name).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def limit_hits(self) -> int:
        """Times this cgroup hit its limit (v1 memory.failcnt, v2 memory.events max)."""
        if self.version == 1:
            return int((self.fs_path / "memory.failcnt").read_text())
        for line in (self.fs_path / "memory.events").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "max":
                return int(value)
        return 0

    def __exit__(self, *exc) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid in self.pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.fs_path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"could not remove test cgroup {self.fs_path}")


@contextlib.contextmanager
def swapfile(size_bytes: int, directory: Path = Path("/var/tmp")) -> Iterator[Path]:
    """A real swap file, swapped on for the duration; swapped off and deleted after, always."""
    path = directory / f"memdiag-test-{uuid.uuid4().hex[:8]}.swap"
    active = False
    try:
        subprocess.run(["fallocate", "-l", str(size_bytes), str(path)], check=True)
        path.chmod(0o600)
        subprocess.run(["mkswap", "-q", str(path)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["swapon", str(path)], check=True)
        active = True
        yield path
    finally:
        # swapoff must read every swapped page back in; it fails (ENOMEM) while a process still
        # holds them under a cgroup limit, so retry while the caller's other cleanups finish.
        deadline = time.monotonic() + 60
        while active:
            active = subprocess.run(["swapoff", str(path)], capture_output=True).returncode != 0
            if active and time.monotonic() > deadline:
                raise RuntimeError(f"could not swapoff test swap file {path}")
            if active:
                time.sleep(0.5)
        path.unlink(missing_ok=True)


class Tty:
    """memdiag with its stderr on a pseudo-terminal (so it prints progress), the text collected."""

    def __init__(self, *args: str):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [MEMDIAG, *args], stdout=subprocess.PIPE, stderr=slave, stdin=subprocess.DEVNULL, text=True
        )
        os.close(slave)
        self.text = ""
        self._master = master
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.text += chunk.decode(errors="replace")

    def wait_for(self, what: str, timeout: float) -> None:
        end = time.monotonic() + timeout
        while what not in self.text:
            assert self.proc.poll() is None, f"memdiag ended before {what!r}: {self.text[-500:]}"
            assert time.monotonic() < end, f"no {what!r} in {timeout} s: {self.text[-500:]}"
            time.sleep(0.05)

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            os.close(self._master)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
