"""The Java workloads of the kit (tests/workloads/java): compiled with the JDK's javac (with debug
information: line numbers in stacks), the JNI library with the C compiler, once per source
content, and run on the real JVM (Debian's OpenJDK 17, which scripts/setup.sh --test installs).
A workload prints "ready" when its state is set up; every process is killed at the end."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
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
    ):
        """user: run as that uid (and gid), through setpriv, with no supplementary groups."""
        self.classes = build_java()
        self.cgroup = cgroup
        self.env = env
        self.proc = None
        self.argv = [str(JAVA), *(jvm or []), f"-Djava.library.path={self.classes}", "-cp", str(self.classes)]
        self.argv += [main, *args]
        if user is not None:
            self.classes.chmod(0o755)
            self.argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *self.argv]
