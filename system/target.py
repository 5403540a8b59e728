"""What a diagnosis or a probe looks at: one process, one memory cgroup, or the whole system. The
one target type: the CLI and serve resolve it (diagnose/target.py), the counters sample it, every
probe aims at it, and its one description names it everywhere (reports, facts, probe results)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ConfigDict

from . import identity
from ._parse import Model
from .cgroup import CgroupLocation, cgroup_pids
from .container import ContainerInfo, PodInfo


class Target(Model):
    model_config = ConfigDict(frozen=True)

    kind: Literal["pid", "cgroup", "system"]
    pid: int | None = None
    comm: str | None = None
    cmdline: list[str] = []
    start_ticks: int | None = None
    # (st_dev, st_ino) of its executable at resolution: with start_ticks, the process it is
    # (system/identity.py), whatever later holds its pid number or runs in it after an exec
    exe_id: tuple[int, int] | None = None
    cgroup: CgroupLocation | None = None  # a pid's memory cgroup, or the cgroup target itself
    container: ContainerInfo | None = None  # the container the target is (or runs in), when one
    pod: PodInfo | None = None  # the Kubernetes pod the target is, when a pod was named

    @classmethod
    def for_pid(cls, pid: int, comm: str | None = None) -> Target:
        return cls(kind="pid", pid=pid, comm=comm)

    @classmethod
    def for_cgroup(cls, location: CgroupLocation) -> Target:
        return cls(kind="cgroup", cgroup=location)

    def describe(self) -> str:
        """The target as a person reads it: PID 123 (orderd), container x (abc), cgroup /x (v2), the whole system."""
        if self.kind == "pid":
            comm = f" ({self.comm})" if self.comm is not None else ""
            inside = f" in {self.container.describe()}" if self.container is not None else ""
            return f"PID {self.pid}{comm}{inside}"
        if self.kind == "cgroup" and self.container is not None:
            return self.container.describe()
        if self.kind == "cgroup" and self.pod is not None:
            return self.pod.describe()
        if self.kind == "cgroup" and self.cgroup is not None:
            return f"cgroup {self.cgroup.path} (v{self.cgroup.version})"
        return "the whole system"

    def pids(self) -> set[int]:
        """Its processes now: the pid, or the cgroup's (a v2 container's may be one folder down)."""
        if self.kind == "pid" and self.pid is not None:
            return {self.pid}
        if self.kind == "cgroup" and self.cgroup is not None:
            return set(cgroup_pids(Path(self.cgroup.fs_path)))
        return set()

    def alive(self) -> bool:
        """A process target: alive AND still the process memdiag resolved (not exited, not
        another image after an exec, not a newcomer with its pid: identity.changed says which)."""
        if self.kind == "pid":
            return self.pid is not None and identity.changed(self) is None
        if self.kind == "cgroup":
            return self.cgroup is not None and Path(self.cgroup.fs_path).is_dir()
        return True

    def changed(self) -> identity.Change | None:
        """How a process target stopped being the process resolved (exited, exec'd, pid reused);
        None while it is the same, and for other targets."""
        return identity.changed(self) if self.kind == "pid" else None
