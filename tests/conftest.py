"""Test harness: the kit on the path, root required where the real kernel is driven, and no
silent skips in CI (MEMDIAG_NO_SKIP=1 turns a skip into a failure).

Markers: a test that uses a fixture of the real machine (BPF_FIXTURES) is marked `bpf`, and one in
a module of long workloads (SLOW_MODULES) `slow`, here at collection, so none is missed by hand.
`pytest -m "not bpf"` is then the fast layer: it runs without root, and a test in it that still
skips for want of root is a failure (its marker is missing), whatever MEMDIAG_NO_SKIP says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from containers import RUNTIME, run_container, workload_image  # noqa: E402
from figures import read_report  # noqa: E402
from kit import MEMDIAG, MemoryCgroup, Workload, swapfile  # noqa: E402
from suiteparts import HOSTWIDE  # noqa: E402

pytest_plugins = ["suitetime"]  # the suite's wall time and where it went, printed at its end

# Fixtures that drive the real machine: root, BPF, cgroups, swap, workloads, the console script,
# podman, servers run as root. A test using one (directly or through another fixture) is `bpf`.
BPF_FIXTURES = frozenset(
    {
        "root_required",
        "workload",
        "java",
        "jvm_container",
        "memcg",
        "swap",
        "memdiag",
        "podman_image",
        "podman_container",
        "server",
        "servers",
        "alertmanager",
        "agents",
        "bcc_ready",
        "_bpf_ready",
    }
)
# Modules whose tests run workloads (or diagnoses) for tens of seconds each: `slow` as well.
SLOW_MODULES = frozenset(
    {
        "e2e/test_alert_loop.py",
        "e2e/test_budget.py",
        "e2e/test_containers.py",
        "e2e/test_culprit.py",
        "e2e/test_distro_nonheap.py",
        "e2e/test_nonheap.py",
        "e2e/test_jvm.py",
        "e2e/test_python_targets.py",
        "e2e/test_runtimes.py",
        "e2e/test_scenarios.py",
        "e2e/test_long_window.py",
        "e2e/test_signals.py",
        "e2e/test_verify.py",
        "probes/test_jvm_instruments.py",
        "probes/test_overhead.py",
        "serve/test_flight_recorder.py",
        "serve/test_jvm_alert.py",
        "serve/test_node_agent.py",
    }
)
TESTS = Path(__file__).resolve().parent
# tests/vm runs inside the second-kernel lane's guest only (scripts/vm.sh sets MEMDIAG_LANE_GUEST=1 there):
# the host's run neither collects nor skips them.
collect_ignore = [] if os.environ.get("MEMDIAG_LANE_GUEST") == "1" else ["vm"]


def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = item.path.relative_to(TESTS).as_posix()
        if rel in HOSTWIDE or f"{rel}::{item.originalname}" in HOSTWIDE:
            item.add_marker(pytest.mark.hostwide)
        if BPF_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.bpf)
        if rel in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.bpf)  # a workload run for tens of seconds is the real kernel's


def _failure(message: str) -> pytest.ExceptionInfo:
    try:  # raised, so it has the traceback pytest's report needs
        raise AssertionError(message)
    except AssertionError as e:
        return pytest.ExceptionInfo.from_exception(e)


def pytest_runtest_makereport(item, call):
    if call.excinfo is None or not call.excinfo.errisinstance(pytest.skip.Exception):
        return
    if os.geteuid() != 0 and item.get_closest_marker("bpf") is None and "root" in str(call.excinfo.value):
        # the fast layer runs without root: a test there that wants root lacks its `bpf` marker
        call.excinfo = _failure(f"needs root but is not marked bpf: {call.excinfo.value}")
    elif os.environ.get("MEMDIAG_NO_SKIP") == "1":
        # Skips are failures when the environment promises everything (this machine, CI).
        call.excinfo = _failure(f"skipped where nothing may skip: {call.excinfo.value}")


@pytest.fixture
def root_required():
    if os.geteuid() != 0:
        pytest.skip("needs root: real cgroups, /proc of other users, BPF")


@pytest.fixture
def workload(root_required):
    """Start workloads; all are killed at the end of the test."""
    started: list[Workload] = []

    def start(
        name: str, *args: str, cgroup: MemoryCgroup | None = None, env: dict | None = None, flags: list | None = None
    ) -> Workload:
        w = Workload(name, *args, cgroup=cgroup, env=env, flags=flags).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def java(root_required):
    """Start the kit's Java programs on the real JVM (tests/jvmkit.py); all killed at the end."""
    from jvmkit import JavaWorkload

    started: list[Workload] = []

    def start(main: str, *args: str, **kw) -> Workload:
        w = JavaWorkload(main, *args, **kw).start()
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


@pytest.fixture
def jvm_container(root_required):
    """A podman container running one of the kit's Java programs on the host's JDK, bind-mounted
    read-only (the image holds the libraries it links); removed at the end."""
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("needs podman and runc (scripts/setup.sh --test installs them)")
    from containers import Image
    from jvmkit import JAVA, build_java, jvm_image_programs, jvm_mounts

    started = []
    with Image(jvm_image_programs()) as image:

        def start(
            main: str, *args: str, jvm: tuple[str, ...] = (), memory: str | None = None, restart: str | None = None
        ):
            c = run_container(
                image,
                str(JAVA.resolve()),
                *jvm,
                "-cp",
                "/app/java",
                main,
                *args,
                memory=memory,
                memory_swap=memory,
                extra=[*jvm_mounts(build_java()), *(["--restart", restart] if restart else [])],
            )
            started.append(c)
            return c

        try:
            yield start
        finally:
            for c in started:
                c.remove()


@pytest.fixture
def memcg(root_required):
    """Make memory cgroups with limits; all removed at the end of the test."""
    made: list[MemoryCgroup] = []

    def make(limit_bytes: int | None, swap: bool = True, name: str | None = None) -> MemoryCgroup:
        cg = MemoryCgroup(limit_bytes, swap=swap, name=name).__enter__()
        made.append(cg)
        return cg

    yield make
    for cg in reversed(made):
        cg.__exit__()


@pytest.fixture
def shm_dir():
    """A folder of the host's /dev/shm of this test's own, removed with what it holds."""
    path = Path("/dev/shm") / f"memdiag-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def swap(root_required):
    with swapfile(1 << 30) as path:
        yield path


def run_memdiag(*args: str, timeout: float = 180, caps: bool = True) -> subprocess.CompletedProcess:
    """Run the installed console script as a user would; caps=False drops every capability."""
    cmd = [MEMDIAG, *args]
    if not caps:
        cmd = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", *cmd]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    if proc.returncode == 0 and "--output" in args:  # setpriv execs: the pid is memdiag's
        read_report(Path(args[args.index("--output") + 1]), memdiag_pid=proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@pytest.fixture
def memdiag():
    return run_memdiag


# The workloads the session's container image holds (at /app/NAME; tests/containers.py).
CONTAINER_WORKLOADS = ("leak", "hog", "registry", "churn")


@pytest.fixture(scope="session")
def podman_image():
    """One image of the workload kit per session (tagged for this run), removed at the end."""
    if os.geteuid() != 0:
        pytest.skip("needs root: podman with runc and cgroupfs")
    if shutil.which("podman") is None or shutil.which(RUNTIME) is None:
        pytest.skip(f"needs podman and {RUNTIME} (scripts/setup.sh --test installs them)")
    with workload_image(*CONTAINER_WORKLOADS) as image:
        yield image


@pytest.fixture
def podman_container(podman_image):
    """Start containers (tests/containers.py run_container; the session image unless image= is
    given); all removed at the end of the test, also when it fails."""
    started = []

    def start(program: str, *args: str, image=None, **kw):
        c = run_container(image or podman_image, program, *args, **kw)
        started.append(c)
        return c

    yield start
    for c in started:
        c.remove()
