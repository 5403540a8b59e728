"""What a diagnosis looks at: one process, one memory cgroup, or the whole system."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from .containers import ContainerInfo, PodInfo, resolve_container
from .errors import UsageError
from .facts.cgroup import BadCgroup, CgroupLocation, locate_memory_cgroup, resolve_cgroup
from .facts.process import ProcessGone, read_process


class Target(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: Literal["pid", "cgroup", "system"]
    pid: int | None = None
    comm: str | None = None
    cmdline: list[str] = []
    start_ticks: int | None = None
    cgroup: CgroupLocation | None = None
    container: ContainerInfo | None = None  # the container the target is (or runs in), when one
    pod: PodInfo | None = None  # the Kubernetes pod the target is, when a pod was named

    def describe(self) -> str:
        if self.kind == "pid":
            inside = f" in {self.container.describe()}" if self.container is not None else ""
            return f"PID {self.pid} ({self.comm}){inside}"
        if self.kind == "cgroup" and self.container is not None:
            return self.container.describe()
        if self.kind == "cgroup" and self.pod is not None:
            return self.pod.describe()
        if self.kind == "cgroup" and self.cgroup is not None:
            return f"cgroup {self.cgroup.path} (v{self.cgroup.version})"
        return "the whole system"


def pid_target(pid: int, proc_root: Path = Path("/proc")) -> Target:
    if pid <= 0:
        raise UsageError(f"--pid {pid}: not a process id")
    try:
        proc = read_process(pid, proc_root)
    except ProcessGone:
        raise UsageError(f"--pid {pid}: no such process") from None
    if proc.state == "Z":
        raise UsageError(f"--pid {pid}: process is a zombie (it has exited; its memory is gone)")
    if proc.rss is None:
        raise UsageError(f"--pid {pid}: {proc.comm} is a kernel thread; it has no user memory to diagnose")
    return Target(
        kind="pid",
        pid=pid,
        comm=proc.comm,
        cmdline=proc.cmdline,
        start_ticks=proc.start_ticks,
        cgroup=locate_memory_cgroup(pid, proc_root),
    )


def cgroup_target(arg: str, proc_root: Path = Path("/proc")) -> Target:
    """A memory cgroup named by the user or a request, refused unless its folder, symlinks resolved,
    lies inside the mounted cgroup hierarchy: `../../tmp/x` with planted memory.* files is never read."""
    try:
        loc = resolve_cgroup(arg, proc_root)
    except BadCgroup as e:
        raise UsageError(f"--cgroup: {e}") from None
    real, mount = os.path.realpath(loc.fs_path), os.path.realpath(loc.mount_point)
    if os.path.commonpath([real, mount]) != mount:
        raise UsageError(f"--cgroup: {arg!r} resolves to {real}, outside the cgroup hierarchy mounted at {mount}")
    if real != os.path.normpath(loc.fs_path) or ".." in Path(arg).parts:
        # cgroupfs has no symlinks and no reason for `..`: a path that needs them is not a cgroup's own name
        raise UsageError(f"--cgroup: {arg!r} goes through '..' or a symlink; name the cgroup by its own path")
    return Target(kind="cgroup", cgroup=loc.model_copy(update={"fs_path": real}))


def container_target(ref: str, proc_root: Path = Path("/proc")) -> Target:
    """A container named by id, id prefix or name: its memory cgroup, diagnosed as --cgroup does."""
    info = resolve_container(ref, proc_root=proc_root)
    target = cgroup_target(info.cgroup, proc_root)
    return target.model_copy(update={"container": info})


def system_target() -> Target:
    return Target(kind="system")
