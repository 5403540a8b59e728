"""The container kit: real podman containers from an image built on this machine, no registry.

An image is a root-fs tarball holding programs (the workload kit's binaries, built with -g, or
host programs such as redis-server) and the libraries ``ldd`` lists for them, dynamic loader
included, imported with ``podman import`` under a tag unique to the test run. Containers run with
runc (crun refuses this host's hybrid cgroups), the cgroupfs manager (no systemd here), no network
and explicit ulimits (podman's default exceeds the host's hard limit). Everything made is removed
on exit, also when the test using it fails: ``podman rm -f``, ``podman rmi``, the tarball.

Measured on the 2-core test machine (podman 4.3, runc 1.1.5, overlay storage): an image build
(tar + import) takes 0.13 s for one workload, 0.4 s for redis-server and its tools; a container
start to its workload's ready line 0.12-0.15 s; removal ~0.15 s. Cheap, yet the pytest fixtures
build one image per session (podman_image in tests/conftest.py)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import resource
import shutil
import subprocess
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kit import build

PODMAN = shutil.which("podman") or "podman"
# The OCI runtime and cgroup manager: runc and cgroupfs on the test host (crun refuses its hybrid
# cgroups; no systemd there); the second-kernel lane's guest (scripts/vm.sh) runs podman's defaults on
# cgroup v2, crun under systemd's manager.
RUNTIME = os.environ.get("MEMDIAG_TEST_OCI_RUNTIME", "runc")
CGROUP_MANAGER = os.environ.get("MEMDIAG_TEST_CGROUP_MANAGER", "cgroupfs")
# Where programs live inside the image: not the host's path, so symbols must come from the container.
APP_DIR = "/app"
# Global options for every podman call: cgroupfs because there is no systemd to manage scopes.
GLOBAL = ["--cgroup-manager", CGROUP_MANAGER]


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    """Run podman with the kit's global options; its output as text. check=True raises with stderr."""
    r = subprocess.run([PODMAN, *GLOBAL, *args], capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args)} failed ({r.returncode}): {r.stderr.strip()}")
    return r


def run_tag() -> str:
    """A tag no other test run uses (several run at once on one machine)."""
    return f"localhost/memdiag-test-{uuid.uuid4().hex[:10]}:latest"


_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")


def shared_libraries(binary: Path) -> list[str]:
    """The paths ldd lists for binary (the dynamic loader included), as the loader will look them up."""
    out = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout
    return [m.group(1) for line in out.splitlines() if (m := _LDD_LINE.search(line))]


def _add_dir(tar: tarfile.TarFile, name: str, added: set[str], mode: int = 0o755) -> None:
    """A folder entry, once: podman refuses a tarball naming one path twice ("duplicates of file
    paths not supported"), as when a program's own path runs through /tmp (a clone in mktemp -d)."""
    if name in added:
        return
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, mode
    tar.addfile(info)
    added.add(name)


def _add_file(tar: tarfile.TarFile, source: Path, arcname: str, added: set[str]) -> None:
    """source's content (symlinks followed) as a regular file at arcname, parents made as needed."""
    arcname = arcname.lstrip("/")
    if arcname in added:
        return
    parts = Path(arcname).parts
    for i in range(1, len(parts)):
        _add_dir(tar, "/".join(parts[:i]), added)
    info = tar.gettarinfo(str(source.resolve()), arcname=arcname)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    with open(source.resolve(), "rb") as f:
        tar.addfile(info, f)
    added.add(arcname)


def in_image(program: str) -> str:
    """Where a program of the image is: /app/NAME, or the absolute path it was given as."""
    return program if program.startswith("/") else f"{APP_DIR}/{program}"


def write_rootfs(tarball: Path, programs: dict[str, Path]) -> None:
    """A root-fs tarball: each program at /app/NAME (at NAME itself when it is an absolute path),
    every library it loads at its host path, and the few files a process expects (/etc/passwd for
    root, empty /tmp)."""
    added: set[str] = set()
    with tarfile.open(tarball, "w") as tar:
        for d in ("tmp", "etc", "proc", "sys", "dev", "run"):  # first: /tmp is sticky whatever lies below it
            _add_dir(tar, d, added, 0o1777 if d == "tmp" else 0o755)
        for name, binary in programs.items():
            _add_file(tar, binary, in_image(name), added)
            for lib in shared_libraries(binary):
                # ldd names a library as the loader found it: java's libjli.so is bin/../lib/libjli.so
                _add_file(tar, Path(lib), os.path.normpath(lib), added)
        passwd = b"root:x:0:0:root:/root:/app/none\nnobody:x:65534:65534:nobody:/:/app/none\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size, info.mode = len(passwd), 0o644
        tar.addfile(info, io.BytesIO(passwd))


@dataclass
class Image:
    """A podman image made from programs on this machine. ``with Image({"leak": build("leak")}) as img``."""

    programs: dict[str, Path]
    tag: str = field(default_factory=run_tag)
    id: str = ""
    build_seconds: float = 0.0

    def __enter__(self) -> Image:
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="memdiag-rootfs-") as tmp:
            tarball = Path(tmp) / "rootfs.tar"
            write_rootfs(tarball, self.programs)
            try:
                self.id = podman("import", "--quiet", str(tarball), self.tag).stdout.strip()
            except BaseException:
                self.__exit__()
                raise
        self.build_seconds = time.monotonic() - t0
        return self

    def __exit__(self, *exc) -> None:
        podman("rmi", "--force", self.tag, check=False)


def host_ulimits() -> list[str]:
    """--ulimit options within the host's hard limits (podman's default, 1048576 files, is above them)."""
    nofile = min(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[1])
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


@dataclass
class Container:
    """A running container: its full id, name, host pid of its first process, memory cgroup path."""

    id: str
    name: str
    pid: int
    cgroup: str
    image: Image
    start_seconds: float = 0.0

    @property
    def short_id(self) -> str:
        return self.id[:12]

    def logs(self) -> str:
        return podman("logs", self.id, check=False).stdout

    def inspect(self, fmt: str) -> str:
        return podman("inspect", "--format", fmt, self.id).stdout.strip()

    def running(self) -> bool:
        return podman("inspect", "--format", "{{.State.Running}}", self.id, check=False).stdout.strip() == "true"

    def remove(self) -> None:
        podman("rm", "--force", "--time", "0", self.id, check=False)


def memory_cgroup_of(pid: int) -> str:
    """The memory cgroup path /proc/PID/cgroup shows (v1 memory line, else the v2 line)."""
    lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))


def run_container(
    image: Image,
    program: str,
    *args: str,
    name: str | None = None,
    memory: str | None = None,
    memory_swap: str | None = None,
    init: bool = False,
    ready: str | None = "ready",
    extra: Iterable[str] = (),
    timeout: float = 30,
) -> Container:
    """Start /app/PROGRAM (or PROGRAM, an absolute path) ARGS in a container of image; wait for its
    `ready` line (None: do not wait). The caller removes it (Container.remove, or the pytest fixture)."""
    name = name or f"memdiag-test-{uuid.uuid4().hex[:8]}"
    opts = ["--runtime", RUNTIME, "--network", "none", *host_ulimits(), "--name", name]
    if memory:
        opts += ["--memory", memory]
    if memory_swap:
        opts += ["--memory-swap", memory_swap]
    if init:
        opts.append("--init")
    t0 = time.monotonic()
    cid = podman("run", "--detach", *opts, *extra, image.tag, in_image(program), *args).stdout.strip()
    try:
        pid = int(podman("inspect", "--format", "{{.State.Pid}}", cid).stdout)
        c = Container(cid, name, pid, memory_cgroup_of(pid), image)
        deadline = time.monotonic() + timeout
        while ready and ready not in c.logs():
            if time.monotonic() > deadline or not c.running():
                raise RuntimeError(f"container {name} ({program}) did not start: {c.logs()!r}")
            time.sleep(0.05)
        c.start_seconds = time.monotonic() - t0
        return c
    except BaseException:
        podman("rm", "--force", "--time", "0", cid, check=False)
        raise


@contextlib.contextmanager
def container(image: Image, program: str, *args: str, **kw):
    """run_container as a context: removed on exit."""
    c = run_container(image, program, *args, **kw)
    try:
        yield c
    finally:
        c.remove()


def workload_image(*names: str) -> Image:
    """An Image of the workload kit's binaries (built with -g), at /app/NAME."""
    return Image({n: build(n) for n in names})


def processes_in(cgroup: str) -> list[int]:
    """Host pids in a v1 memory cgroup path (tests check what the runtime put there)."""
    procs = Path("/sys/fs/cgroup/memory") / cgroup.lstrip("/") / "cgroup.procs"
    return [int(p) for p in procs.read_text().split()]


def ns_pid(host_pid: int) -> int:
    """The pid a process has in its own (innermost) pid namespace, from NSpid in /proc/PID/status."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    raise RuntimeError(f"no NSpid for {host_pid}")


def leftovers(prefix: str = "memdiag-test-") -> tuple[list[str], list[str]]:
    """Containers and images of the kit still present (for a test that checks cleanup)."""
    names = podman("ps", "--all", "--format", "{{.Names}}", check=False).stdout.split()
    tags = podman("images", "--format", "{{.Repository}}", check=False).stdout.split()
    return [n for n in names if n.startswith(prefix)], [t for t in tags if prefix in t]
