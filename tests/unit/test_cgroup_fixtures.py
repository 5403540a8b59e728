"""Cgroup discovery and readers on fixture trees: pure v2, hybrid (v1 memory + v2), namespaced
mounts. This machine's memory controller is on v1, so v2 is tested here in the kernel's
documented file formats (Documentation/admin-guide/cgroup-v2.rst)."""

from pathlib import Path

import pytest
from memdiag.system.cgroup import (
    BadCgroup,
    locate_memory_cgroup,
    read_cgroup_memory,
    resolve_cgroup,
)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _proc(tmp: Path, pid: int, cgroup: str, mountinfo: str) -> Path:
    proc = tmp / "proc"
    _write(proc / str(pid) / "cgroup", cgroup)
    _write(proc / "self" / "mountinfo", mountinfo)
    return proc


def _v2_tree(tmp: Path) -> Path:
    root = tmp / "sys" / "fs" / "cgroup"
    _write(root / "cgroup.controllers", "cpuset cpu io memory pids\n")
    slice_ = root / "system.slice"
    _write(slice_ / "memory.max", "1073741824\n")
    svc = slice_ / "orderd.service"
    _write(svc / "memory.current", "402653184\n")
    _write(svc / "memory.max", "2147483648\n")  # higher than its parent's: the parent's limit rules
    _write(svc / "memory.high", "max\n")
    _write(svc / "memory.peak", "500000000\n")
    _write(svc / "memory.swap.current", "1048576\n")
    _write(svc / "memory.swap.max", "max\n")
    _write(svc / "memory.events", "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n")
    _write(svc / "memory.events.local", "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n")
    _write(svc / "memory.stat", "anon 390000000\nfile 12000000\nshmem 0\npgmajfault 4\n")
    _write(
        svc / "memory.pressure",
        "some avg10=1.50 avg60=0.50 avg300=0.10 total=999\nfull avg10=0.50 avg60=0.10 avg300=0.00 total=333\n",
    )
    _write(svc / "cgroup.procs", "4242\n4243\n")
    return root


def test_pure_v2(tmp_path):
    root = _v2_tree(tmp_path)
    proc = _proc(
        tmp_path,
        4242,
        "0::/system.slice/orderd.service\n",
        f"30 1 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n",
    )
    loc = locate_memory_cgroup(4242, proc)
    assert loc.version == 2 and loc.path == "/system.slice/orderd.service"
    assert Path(loc.fs_path) == root / "system.slice" / "orderd.service"
    m = read_cgroup_memory(loc)
    assert m.usage == 402653184
    assert m.limit == 2147483648 and m.effective_limit == 1073741824
    assert m.high is None and m.swap_limit is None  # "max" is no limit
    assert m.swap_usage == 1048576 and m.max_usage == 500000000
    assert m.oom_kill == 1 and m.oom == 2 and m.failcnt == 17
    assert m.events_local["max"] == 17 and m.stat["anon"] == 390000000
    assert m.pressure.some.avg10 == 1.5 and m.pressure.full.total_us == 333
    assert m.procs == [4242, 4243]


def test_v2_without_memory_controller_is_none(tmp_path):
    root = tmp_path / "sys" / "fs" / "cgroup"
    _write(root / "cgroup.controllers", "cpu io pids\n")
    proc = _proc(tmp_path, 7, "0::/x\n", f"30 1 0:26 / {root} rw - cgroup2 cgroup2 rw\n")
    assert locate_memory_cgroup(7, proc) is None


def test_hybrid_prefers_v1_memory(tmp_path):
    v1 = tmp_path / "sys" / "fs" / "cgroup" / "memory"
    grp = v1 / "orders"
    _write(grp / "memory.usage_in_bytes", "104857600\n")
    _write(grp / "memory.limit_in_bytes", "134217728\n")
    _write(grp / "memory.max_usage_in_bytes", "130000000\n")
    _write(grp / "memory.failcnt", "9\n")
    _write(grp / "memory.memsw.usage_in_bytes", "110100480\n")
    _write(grp / "memory.memsw.limit_in_bytes", "9223372036854771712\n")
    _write(grp / "memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    _write(grp / "memory.stat", "rss 100000000\ncache 4857600\nhierarchical_memory_limit 134217728\n")
    _write(grp / "cgroup.procs", "55\n")
    mountinfo = (
        f"32 31 0:29 / {v1} rw,relatime - cgroup cgroup rw,memory\n"
        f"33 31 0:30 / {tmp_path}/sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
    )
    proc = _proc(tmp_path, 55, "9:name=systemd:/\n4:memory:/orders\n0::/\n", mountinfo)
    loc = locate_memory_cgroup(55, proc)
    assert loc.version == 1 and loc.path == "/orders" and Path(loc.fs_path) == grp
    m = read_cgroup_memory(loc)
    assert m.usage == 104857600 and m.limit == 134217728 and m.effective_limit == 134217728
    assert m.swap_usage == 110100480 - 104857600 and m.swap_limit is None
    assert m.oom_kill == 3 and m.under_oom is False and m.failcnt == 9
    assert m.pressure is None  # v1 has no per-cgroup PSI


def test_namespaced_mount_root(tmp_path):
    # Inside a container the cgroup mount's root is the container's own cgroup.
    root = tmp_path / "cg"
    _write(root / "cgroup.controllers", "memory\n")
    _write(root / "worker" / "memory.current", "1\n")
    proc = _proc(
        tmp_path, 9, "0::/kubepods/pod1/ctr/worker\n", f"40 1 0:50 /kubepods/pod1/ctr {root} rw - cgroup2 cgroup2 rw\n"
    )
    loc = locate_memory_cgroup(9, proc)
    assert Path(loc.fs_path) == root / "worker"


def test_resolve_user_path_and_errors(tmp_path):
    root = _v2_tree(tmp_path)
    proc = _proc(tmp_path, 1, "0::/\n", f"30 1 0:26 / {root} rw - cgroup2 cgroup2 rw\n")
    by_hierarchy = resolve_cgroup("/system.slice/orderd.service", proc)
    by_fs = resolve_cgroup(str(root / "system.slice" / "orderd.service"), proc)
    assert by_hierarchy == by_fs
    assert by_hierarchy.path == "/system.slice/orderd.service"
    with pytest.raises(BadCgroup, match="is not a memory cgroup"):
        resolve_cgroup("/no/such/group", proc)
    with pytest.raises(BadCgroup, match="is not a memory cgroup"):
        resolve_cgroup(str(tmp_path), proc)  # a directory, but outside every cgroup mount


def test_no_hierarchy_mounted(tmp_path):
    proc = _proc(tmp_path, 1, "0::/\n", "20 1 0:5 / /proc rw - proc proc rw\n")
    with pytest.raises(BadCgroup, match="no memory cgroup hierarchy"):
        resolve_cgroup("/x", proc)


def test_a_v2_container_whose_limit_is_on_its_leaf(tmp_path):
    """crun on cgroup v2 may hold a container's processes, and its memory.max, in the scope's
    `container` leaf: the scope's own limit, the container's, and its effective limit are the leaf's."""
    from memdiag.diagnose.containers import _info
    from memdiag.system.cgroup import CgroupLocation, own_limit
    from memdiag.system.container import parse_container_path

    root = tmp_path / "sys" / "fs" / "cgroup"
    _write(root / "cgroup.controllers", "memory pids\n")
    cid = "ab" * 32
    scope = root / "machine.slice" / f"libpod-{cid}.scope"
    _write(scope / "memory.max", "max\n")
    _write(scope / "memory.current", "104857600\n")
    _write(scope / "cgroup.procs", "")
    _write(scope / "container" / "memory.max", "536870912\n")
    _write(scope / "container" / "memory.current", "104857600\n")
    _write(scope / "container" / "cgroup.procs", "5151\n")
    path = f"/machine.slice/libpod-{cid}.scope"
    loc = CgroupLocation(version=2, path=path, fs_path=str(scope), mount_point=str(root))
    m = read_cgroup_memory(loc)
    assert m.limit == 512 << 20 and m.effective_limit == 512 << 20 and m.procs == [5151]
    assert own_limit(scope) == 512 << 20
    info = _info(parse_container_path(path), None, root, tmp_path / "proc")
    assert info.limit_bytes == 512 << 20
    # two leaves with processes are two cgroups of their own: no limit is taken from either
    _write(scope / "other" / "memory.max", "1048576\n")
    _write(scope / "other" / "cgroup.procs", "5152\n")
    assert own_limit(scope) is None and read_cgroup_memory(loc).effective_limit is None
