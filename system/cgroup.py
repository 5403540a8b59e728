"""The memory cgroup of a process, v2 (unified) or v1 (hybrid/legacy layouts), found from
/proc/PID/cgroup and the mount table, and its counters: usage, limit, swap, OOM events, stat, PSI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from ._parse import Fact, int_or_none, kv_lines, read_text
from .psi import Psi, read_psi_file

# v1 reports "no limit" as PAGE_COUNTER_MAX pages (9223372036854771712 on 64-bit);
# anything this large is no limit at all.
_UNLIMITED = 1 << 62


class BadCgroup(Exception):
    """A path that is not a memory cgroup on this host."""


class Mount(Fact):
    mount_point: str
    root: str
    fstype: str
    super_options: list[str]


class CgroupLocation(Fact):
    version: Literal[1, 2]
    path: str  # inside the hierarchy, e.g. /system.slice/orderd.service
    fs_path: str  # where its files are, e.g. /sys/fs/cgroup/system.slice/orderd.service
    mount_point: str


class CgroupMemory(Fact):
    version: Literal[1, 2]
    path: str
    fs_path: str
    usage: int | None = None
    limit: int | None = Field(None, description="own limit; None = unlimited")
    effective_limit: int | None = Field(None, description="lowest limit of this cgroup and its ancestors")
    high: int | None = None
    max_usage: int | None = None
    failcnt: int | None = None
    swap_usage: int | None = None
    swap_limit: int | None = None
    oom: int | None = None
    oom_kill: int | None = None
    under_oom: bool | None = None
    oom_kill_disable: bool | None = None
    events: dict[str, int] = {}
    events_local: dict[str, int] = {}
    stat: dict[str, int] = {}
    pressure: Psi | None = None
    procs: list[int] = []
    # v1 only: kernel memory charged to it (memory.kmem.usage_in_bytes; v1's usage includes it,
    # its memory.stat does not split it), and TCP socket buffers (a counter of their own on v1)
    kmem_usage: int | None = None
    kmem_tcp_usage: int | None = None


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...)
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 3 < len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        mounts.append(
            Mount(
                mount_point=_unescape(lf[4]),
                root=_unescape(lf[3]),
                fstype=rf[0],
                super_options=rf[2].split(","),
            )
        )
    return mounts


def on_fuse(mounts: list[Mount], path: str, below: bool = False) -> bool:
    """Whether reaching `path` crosses a FUSE mount of this table (one at or above it), or, with below,
    whether one sits under it: a FUSE daemon is the mount owner's to answer, and one that never answers
    holds the reader for ever."""
    here = path.rstrip("/") + "/"
    for m in mounts:
        if m.fstype.startswith("fuse"):
            point = m.mount_point.rstrip("/") + "/"
            if here.startswith(point) or (below and point.startswith(here)):
                return True
    return False


def parse_proc_cgroup(text: str) -> list[tuple[str, list[str], str]]:
    """(hierarchy id, controllers, path) per line; path may contain ':'."""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append((parts[0], [c for c in parts[1].split(",") if c], parts[2]))
    return entries


def _memory_mounts(mounts: list[Mount]) -> tuple[Mount | None, Mount | None]:
    """(v1 mount carrying the memory controller, cgroup2 mount)."""
    v1 = next((m for m in mounts if m.fstype == "cgroup" and "memory" in m.super_options), None)
    v2 = next((m for m in mounts if m.fstype == "cgroup2"), None)
    return v1, v2


def memory_hierarchy(proc_root: Path = Path("/proc")) -> tuple[Literal[1, 2], Mount] | None:
    """The mount holding the memory controller, as locate_memory_cgroup chooses it: v1's memory
    hierarchy when mounted (hybrid layouts), else cgroup2. None: no memory controller mounted."""
    v1, v2 = _memory_mounts(parse_mountinfo(read_text(proc_root / "self" / "mountinfo") or ""))
    if v1 is not None:
        return 1, v1
    return (2, v2) if v2 is not None else None


def limit_bytes(fs_path: Path) -> int | None:
    """A cgroup folder's own memory limit (memory.max, or v1's memory.limit_in_bytes); None: unlimited."""
    for name in ("memory.max", "memory.limit_in_bytes"):
        text = read_text(fs_path / name)
        if text is not None:
            return _bytes_or_unlimited(text)
    return None


def _under(mount: Mount, cg_path: str) -> Path:
    # A mount's root is the cgroup it exposes (cgroup namespaces, bind mounts in containers).
    rel = os.path.relpath(cg_path, mount.root) if mount.root != "/" else cg_path.lstrip("/")
    if rel == ".":
        rel = ""
    return Path(mount.mount_point) / rel


def locate_memory_cgroup(pid: int, proc_root: Path = Path("/proc")) -> CgroupLocation | None:
    """Where the memory controller accounts pid. None when no memory controller is mounted."""
    text = read_text(proc_root / str(pid) / "cgroup")
    if text is None:
        return None
    mounts = parse_mountinfo(read_text(proc_root / "self" / "mountinfo") or "")
    v1_mount, v2_mount = _memory_mounts(mounts)
    entries = parse_proc_cgroup(text)
    v1_entry = next((e for e in entries if "memory" in e[1]), None)
    if v1_entry is not None and v1_mount is not None:
        return CgroupLocation(
            version=1,
            path=v1_entry[2],
            fs_path=str(_under(v1_mount, v1_entry[2])),
            mount_point=v1_mount.mount_point,
        )
    v2_entry = next((e for e in entries if e[0] == "0" and not e[1]), None)
    if v2_entry is not None and v2_mount is not None:
        root_controllers = (read_text(Path(v2_mount.mount_point) / "cgroup.controllers") or "").split()
        if "memory" not in root_controllers:
            return None
        return CgroupLocation(
            version=2,
            path=v2_entry[2],
            fs_path=str(_under(v2_mount, v2_entry[2])),
            mount_point=v2_mount.mount_point,
        )
    return None


def _has_file(folder: Path, name: str) -> bool:
    """Whether folder/name exists; a name the kernel refuses (ENAMETOOLONG, EACCES) is no cgroup,
    where Path.exists() would raise."""
    try:
        return (folder / name).exists()
    except OSError:
        return False


def resolve_cgroup(arg: str, proc_root: Path = Path("/proc")) -> CgroupLocation:
    """A user's --cgroup: a directory under a cgroup mount, or a path inside the memory hierarchy
    (``/system.slice/x.service``). Raise BadCgroup with a one-line reason otherwise."""
    mounts = parse_mountinfo(read_text(proc_root / "self" / "mountinfo") or "")
    v1_mount, v2_mount = _memory_mounts(mounts)
    candidates: list[tuple[int, Mount, Path]] = []
    for version, mount in ((1, v1_mount), (2, v2_mount)):
        if mount is None:
            continue
        mp = Path(mount.mount_point)
        given = Path(arg)
        if given.is_absolute() and (given == mp or mp in given.parents):
            candidates.append((version, mount, given))
        else:
            candidates.append((version, mount, mp / arg.lstrip("/")))
    for version, mount, fs in candidates:
        marker = "memory.limit_in_bytes" if version == 1 else "memory.current"
        if _has_file(fs, marker):
            inside = fs.relative_to(mount.mount_point).as_posix()
            path = mount.root.rstrip("/") + ("" if inside == "." else "/" + inside)
            return CgroupLocation(version=version, path=path or "/", fs_path=str(fs), mount_point=mount.mount_point)
    if not candidates:
        raise BadCgroup("no memory cgroup hierarchy is mounted on this host")
    where = ", ".join(sorted({str(c[2]) for c in candidates}))
    raise BadCgroup(f"{arg!r} is not a memory cgroup (looked for {where})")


def memcg_matches(memcg: str | None, cgroup_path: str) -> bool:
    """Whether memcg (a path in the hierarchy) is cgroup_path or below it."""
    if memcg is None:
        return False
    return memcg == cgroup_path or memcg.startswith(cgroup_path.rstrip("/") + "/")


def _v1_swap(stat: dict[str, int], memsw_usage: int | None, usage: int | None) -> int | None:
    """v1 swap usage: memory.stat's (one read, hierarchical where the kernel gives it), else
    memsw minus usage, two reads apart and so never below zero (a trial read -2 MiB)."""
    for key in ("total_swap", "swap"):
        if key in stat:
            return stat[key]
    if memsw_usage is None or usage is None:
        return None
    return max(0, memsw_usage - usage)


def _bytes_or_unlimited(value: str | None) -> int | None:
    if value is None or value.strip() == "max":
        return None
    number = int_or_none(value.strip())
    if number is None or number >= _UNLIMITED:
        return None
    return number


def _int_map(text: str | None) -> dict[str, int]:
    if text is None:
        return {}
    return {k: v for k, raw in kv_lines(text).items() if (v := int_or_none(raw)) is not None}


def _pids_in(fs: Path) -> list[int]:
    return [int(p) for p in (read_text(fs / "cgroup.procs") or "").split() if p.isdigit()]


def cgroup_pids(fs: Path) -> list[int]:
    """The processes of a cgroup folder: its own, or, when it has none, those of the folders below
    it. cgroup v2 keeps a cgroup that delegates to children free of processes of its own (a
    container's `libpod-<id>.scope` whose processes are in its `container` leaf), while its memory
    counts theirs."""
    own = _pids_in(fs)
    if own:
        return own
    try:
        below = sorted(fs.rglob("cgroup.procs"))
    except OSError:
        return []
    return sorted({pid for procs in below for pid in _pids_in(procs.parent)})


def sole_leaf(fs: Path) -> Path | None:
    """The one folder below fs holding all its processes, when fs holds none of its own (a
    container's `libpod-<id>.scope/container` under crun on cgroup v2); None otherwise."""
    if _pids_in(fs):
        return None
    try:
        holders = {procs.parent for procs in fs.rglob("cgroup.procs") if procs.parent != fs and _pids_in(procs.parent)}
    except OSError:
        return None
    return holders.pop() if len(holders) == 1 else None


def own_limit(fs: Path) -> int | None:
    """A cgroup folder's own memory limit, or, for one whose processes all sit in one leaf below it
    (sole_leaf), the lowest limit from that leaf up to it: the runtime may set a container's limit on
    its leaf rather than its scope. None: unlimited."""
    mine = limit_bytes(fs)
    limits = [mine] if mine is not None else []
    node = sole_leaf(fs)
    while node is not None and node != fs and fs in node.parents:
        if (lim := limit_bytes(node)) is not None:
            limits.append(lim)
        node = node.parent
    return min(limits) if limits else None


def _v2_effective_limit(fs: Path, mount_point: Path, own: int | None) -> int | None:
    limits = []
    node = fs
    while True:
        limit = _bytes_or_unlimited(read_text(node / "memory.max"))
        if limit is not None:
            limits.append(limit)
        if node == mount_point or mount_point not in node.parents:
            break
        node = node.parent
    if own is not None:  # its own_limit: a container's limit may be on the leaf holding its processes
        limits.append(own)
    return min(limits) if limits else None


def read_cgroup_v2(loc: CgroupLocation) -> CgroupMemory:
    fs = Path(loc.fs_path)
    events = _int_map(read_text(fs / "memory.events"))
    own = own_limit(fs)
    return CgroupMemory(
        version=2,
        path=loc.path,
        fs_path=loc.fs_path,
        usage=int_or_none((read_text(fs / "memory.current") or "").strip()),
        limit=own,
        effective_limit=_v2_effective_limit(fs, Path(loc.mount_point), own),
        high=_bytes_or_unlimited(read_text(fs / "memory.high")),
        max_usage=int_or_none((read_text(fs / "memory.peak") or "").strip()),  # 5.19+
        failcnt=events.get("max"),
        swap_usage=int_or_none((read_text(fs / "memory.swap.current") or "").strip()),
        swap_limit=_bytes_or_unlimited(read_text(fs / "memory.swap.max")),
        oom=events.get("oom"),
        oom_kill=events.get("oom_kill"),
        events=events,
        events_local=_int_map(read_text(fs / "memory.events.local")),
        stat=_int_map(read_text(fs / "memory.stat")),
        pressure=read_psi_file(fs / "memory.pressure"),
        procs=cgroup_pids(fs),
    )


def read_cgroup_v1(loc: CgroupLocation) -> CgroupMemory:
    fs = Path(loc.fs_path)

    def number(name: str) -> int | None:
        return int_or_none((read_text(fs / name) or "").strip())

    usage = number("memory.usage_in_bytes")
    memsw_usage = number("memory.memsw.usage_in_bytes")  # needs swapaccount=1
    limit = _bytes_or_unlimited(read_text(fs / "memory.limit_in_bytes"))
    stat = _int_map(read_text(fs / "memory.stat"))
    oom_control = _int_map(read_text(fs / "memory.oom_control"))
    effective = (
        _bytes_or_unlimited(str(stat["hierarchical_memory_limit"])) if ("hierarchical_memory_limit" in stat) else limit
    )
    return CgroupMemory(
        version=1,
        path=loc.path,
        fs_path=loc.fs_path,
        usage=usage,
        limit=limit,
        effective_limit=effective,
        max_usage=number("memory.max_usage_in_bytes"),
        failcnt=number("memory.failcnt"),
        swap_usage=_v1_swap(stat, memsw_usage, usage),
        swap_limit=_bytes_or_unlimited(read_text(fs / "memory.memsw.limit_in_bytes")),
        oom_kill=oom_control.get("oom_kill"),  # 4.13+
        under_oom=bool(oom_control["under_oom"]) if "under_oom" in oom_control else None,
        oom_kill_disable=bool(oom_control["oom_kill_disable"]) if "oom_kill_disable" in oom_control else None,
        stat=stat,
        pressure=None,  # v1 has no per-cgroup PSI file
        procs=cgroup_pids(fs),
        kmem_usage=number("memory.kmem.usage_in_bytes"),
        kmem_tcp_usage=number("memory.kmem.tcp.usage_in_bytes"),
    )


def read_cgroup_memory(loc: CgroupLocation) -> CgroupMemory:
    if not Path(loc.fs_path).is_dir():
        raise BadCgroup(f"cgroup {loc.path} no longer exists")
    return read_cgroup_v1(loc) if loc.version == 1 else read_cgroup_v2(loc)


CGROUP_MAX_DEPTH = 16  # deepest folder walked; real layouts (Kubernetes' systemd slices) stop at 7


def cgroup_folders(mount: Path):
    """(path inside the hierarchy) of every folder under a hierarchy's mount, the root excluded,
    at most CGROUP_MAX_DEPTH deep: the one walk of the cgroup tree (containers, pods, serve's ids)."""
    # scandir's entry types (cgroupfs gives them) and a stack of our own, not os.walk: every folder of
    # a cgroup holds dozens of files, and serve's recorder walks the tree every round
    base = str(mount).rstrip("/")
    stack = [("", 0)]
    while stack:
        rel, depth = stack.pop()
        if rel:
            yield rel
        if depth >= CGROUP_MAX_DEPTH:
            continue
        try:
            with os.scandir(base + rel) as it:
                below = [e.name for e in it if e.is_dir(follow_symlinks=False)]
        except OSError:  # a folder gone mid-walk, or unreadable: its subtree is not walked
            continue
        stack.extend((f"{rel}/{name}", depth + 1) for name in reversed(below))
