"""The target a user or an alert names, resolved and checked: a process, a memory cgroup, a
container (its largest process), or the whole system (the Target type itself: system/target.py)."""

from __future__ import annotations

import os
from pathlib import Path

from memdiag.system import identity
from memdiag.system.cgroup import BadCgroup, CgroupLocation, cgroup_pids, locate_memory_cgroup, resolve_cgroup
from memdiag.system.process import ProcessGone, read_process
from memdiag.system.processes import read_all_processes
from memdiag.system.target import Target

from .containers import container_of_cgroup, resolve_container
from .errors import UsageError


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
    exe = None
    if proc_root == Path("/proc"):  # the process itself is held, not its number (system/identity.py)
        try:
            exe = identity.hold(pid, proc.start_ticks)
        except identity.TargetChanged as e:
            raise UsageError(f"--pid {pid}: {e.strerror}") from None
    return Target(
        kind="pid",
        pid=pid,
        comm=proc.comm,
        cmdline=proc.cmdline,
        start_ticks=proc.start_ticks,
        exe_id=exe,
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
    """A container named by id, id prefix or name: its largest process, carrying the container (as
    serve does with a container's alert: the same target from the CLI and from an alert)."""
    info = resolve_container(ref, proc_root=proc_root)
    target = cgroup_target(info.cgroup, proc_root)
    return as_largest_process(target.model_copy(update={"container": info}), proc_root)


def largest_process(cg: CgroupLocation, proc_root: Path = Path("/proc")) -> int | None:
    """The largest process by RSS in the cgroup or below it (a pod's processes are in its containers')."""
    pids = cgroup_pids(Path(cg.fs_path))  # guarded: a folder removed during the walk (at an OOM kill)
    procs = read_all_processes(proc_root, pids=pids) if pids else {}
    if not procs:
        return None
    return max(procs.values(), key=lambda p: p.rss or 0).pid


def as_largest_process(target: Target, proc_root: Path = Path("/proc")) -> Target:
    """A container's or pod's cgroup diagnosed as its largest process: allocation tracing (memleak,
    the reachability scan) is priced and attached per process, and leak versus cache needs it. The
    container and pod stay with the target; an empty cgroup stays a cgroup target."""
    pid = largest_process(target.cgroup, proc_root) if target.cgroup else None
    if pid is None:
        return with_container(target)
    try:
        own = pid_target(pid, proc_root)
    except UsageError:  # it exited since: the cgroup is what is left to diagnose ("--pid N" was never said)
        return with_container(target)
    return with_container(own.model_copy(update={"container": target.container, "pod": target.pod}))


def system_target() -> Target:
    return Target(kind="system")


def with_container(target: Target) -> Target:
    """The target with the container its cgroup is in, when no label said it already."""
    if target.container is not None or target.cgroup is None:
        return target
    return target.model_copy(update={"container": container_of_cgroup(target.cgroup.path)})
