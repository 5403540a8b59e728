"""The Java workloads of the kit (tests/workloads/java): compiled with the JDK's javac (with debug
information: line numbers in stacks), the JNI library with the C compiler, once per source
content, and run on the real JVM (Debian's OpenJDK 17, which scripts/setup.sh --test installs).
A workload prints "ready" when its state is set up; every process is killed at the end."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from kit import BUILD, SOURCES, Workload

JAVA_SOURCES = SOURCES / "java"
JAVA_HOME = Path(os.environ.get("MEMDIAG_TEST_JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64"))
JAVA = JAVA_HOME / "bin" / "java"


def have_jdk() -> bool:
    return (JAVA_HOME / "bin" / "javac").exists() and (JAVA_HOME / "include" / "jni.h").exists()


def build_java() -> Path:
    """The class folder of every Java workload, with libnativeleak.so beside the classes."""
    sources = sorted(JAVA_SOURCES.glob("*.java"))
    native = JAVA_SOURCES / "nativeleak.c"
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in [*sources, native]) + str(JAVA_HOME).encode())
    out = BUILD / "java" / digest.hexdigest()[:12]
    if not (out / "libnativeleak.so").exists():
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        subprocess.run([str(JAVA_HOME / "bin" / "javac"), "-g", "-d", str(tmp), *map(str, sources)], check=True)
        include = JAVA_HOME / "include"
        subprocess.run(
            ["cc", "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-Wall", "-Werror"]
            + [f"-I{include}", f"-I{include / 'linux'}", "-o", str(tmp / "libnativeleak.so"), str(native)],
            check=True,
        )
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    return out


class JavaWorkload(Workload):
    """One of the kit's Java programs on the real JVM: JavaWorkload("OrderService", "1000", jvm=["-Xmx1g"])."""

    def __init__(
        self,
        main: str,
        *args: str,
        jvm: list[str] | None = None,
        env: dict | None = None,
        cgroup=None,
        user: int | None = None,
        classpath: list[str] | None = None,
        ready: str = "ready",
    ):
        """user: run as that uid (and gid), through setpriv, with no supplementary groups;
        classpath: jars beside the kit's classes (a Debian program's); ready: how its first line of
        output starts once it is ready."""
        self.classes = build_java()
        self.staged: Path | None = None
        if user is not None:
            # another user must reach the classes: the checkout may sit below a folder only root enters
            # (a clone in a mktemp -d folder, mode 0700, failed this way), so they are copied to a folder
            # of their own under /tmp, readable by all, removed by stop()
            self.staged = Path(tempfile.mkdtemp(prefix="memdiag-java-"))
            self.staged.chmod(0o755)
            self.classes = Path(shutil.copytree(self.classes, self.staged / "classes"))
            for d in [self.classes, *self.classes.rglob("*")]:
                d.chmod(0o755 if d.is_dir() or d.suffix == ".so" else 0o644)
        self.cgroup = cgroup
        self.env = env
        self.cwd: Path | None = None  # the test's working folder (the JVM writes nothing there)
        self.proc = None
        self.ready = ready
        path = ":".join([str(self.classes), *(classpath or [])])
        self.argv = [str(JAVA), *(jvm or []), f"-Djava.library.path={self.classes}", "-cp", path, main, *args]
        if user is not None:
            self.argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *self.argv]

    def stop(self) -> None:
        """SIGTERM first: the JVM then removes its hsperfdata file and attach socket from /tmp (a
        SIGKILL leaves them there); SIGKILL after 10 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        super().stop()
        if self.staged is not None:
            shutil.rmtree(self.staged, ignore_errors=True)


def jvm_image_programs() -> dict[str, Path]:
    """What a container image needs to run the host's JDK bind-mounted into it: the JDK's ELF files
    (the launchers and its libraries), whose own dependencies the image takes from the host
    (tests/containers.py copies each with every library ldd lists)."""
    real = JAVA_HOME.resolve()
    elves = [real / "bin" / "java", real / "bin" / "jfr", *sorted((real / "lib").rglob("*.so"))]
    return {str(p): p for p in elves}


def jvm_mounts(classes: Path) -> list[str]:
    """podman options that put the host's JDK (and the /etc files its conf links to) and the kit's
    classes into a container, read-only, at the paths the JVM expects."""
    real = JAVA_HOME.resolve()
    etc = "/etc/java-17-openjdk"
    return ["-v", f"{real}:{real}:ro", "-v", f"{etc}:{etc}:ro", "-v", f"{classes}:/app/java:ro"]


def wait_warmed_up(pid: int, quiet_s: float = 2.0, timeout: float = 60) -> None:
    """Wait until the JVM is past its start-up, as a service diagnosed in production is: its JIT
    compiled nothing new for quiet_s (its own counter, sun.ci.totalCompiles). Start-up loads classes
    and compiles code into native memory, which is not the growth a test diagnoses."""
    from memdiag.system.hsperfdata import read_perfdata

    def compiles() -> int | None:
        perf = read_perfdata(pid)
        return perf.number("sun.ci.totalCompiles") if perf is not None else None

    deadline = time.monotonic() + timeout
    last, since = compiles(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = compiles()
        if now != last or now is None:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
    raise AssertionError(f"the JVM {pid} kept compiling for {timeout:.0f} s")
