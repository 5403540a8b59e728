"""Fact readers on this machine's real /proc and cgroups, against real workloads."""

import time
from pathlib import Path

import psutil
from memdiag.system.cgroup import locate_memory_cgroup, read_cgroup_memory, resolve_cgroup
from memdiag.system.kmsg import read_oom_kills
from memdiag.system.meminfo import read_meminfo
from memdiag.system.process import read_process
from memdiag.system.psi import read_memory_pressure
from memdiag.system.slab import read_slabinfo
from memdiag.system.swaps import read_swaps
from memdiag.system.vmstat import read_vmstat

MiB = 1 << 20


def test_meminfo_agrees_with_psutil():
    m = read_meminfo()
    vm = psutil.virtual_memory()
    assert m.mem_total == vm.total
    assert abs(m.mem_available - vm.available) < 0.05 * vm.total


def test_vmstat_and_psi_are_read():
    v = read_vmstat()
    assert v.get("pgfault") > 0
    assert v.get("allocstall") is not None
    psi = read_memory_pressure()
    assert psi is not None and psi.some is not None and psi.some.total_us >= 0


def test_process_rss_grows_under_a_leak(workload):
    w = workload("leak", "4096")
    first = read_process(w.pid)
    time.sleep(1.5)
    # the same figure as psutil's, read between two of its reads: the leak grows all the while
    low = psutil.Process(w.pid).memory_info().rss
    second = read_process(w.pid)
    high = psutil.Process(w.pid).memory_info().rss
    assert first.comm == "leak" and first.cmdline[1:] == ["4096"]
    assert second.rss - first.rss > 2 * MiB
    assert second.rss_anon - first.rss_anon > 2 * MiB
    assert second.minflt > first.minflt
    assert low <= second.rss <= high, (low, second.rss, high)


def test_process_in_a_limited_cgroup(workload, memcg):
    cg = memcg(96 * MiB)
    w = workload("cache", "16", "1", cgroup=cg)
    loc = locate_memory_cgroup(w.pid)
    assert loc.path == cg.path and loc.version == cg.version
    m = read_cgroup_memory(loc)
    assert m.limit == 96 * MiB and m.effective_limit == 96 * MiB
    assert m.procs == [w.pid]
    assert m.oom_kill == 0
    assert m.usage > 0


def test_slabinfo_and_swaps(swap):
    # no workload here, so swapoff has nothing to read back
    caches = read_slabinfo()
    assert caches and any(c.name.startswith("kmalloc") for c in caches)
    assert sum(c.size_bytes for c in caches) > MiB
    devices = read_swaps()
    assert str(swap) in [d.filename for d in devices]


def test_real_oom_kill_is_read_from_the_kernel_log(workload, memcg):
    cg = memcg(48 * MiB, swap=False)
    w = workload("hog", "256", "8", "20", cgroup=cg)
    assert w.wait_exit(30) == -9
    kills = [k for k in read_oom_kills() if k.victim_pid == w.pid]
    assert len(kills) == 1
    (kill,) = kills
    assert kill.victim_comm == "hog" and kill.cgroup_oom
    assert kill.oom_memcg == cg.path
    assert abs(kill.when - time.time()) < 60
    assert read_cgroup_memory(resolve_cgroup(cg.path)).oom_kill == 1


def test_real_oom_kill_carries_the_kernels_account_of_its_cgroup(workload, memcg):
    """The kernel's report of a memcg OOM kill says the cgroup's limit, usage and memory.stat at the
    kill; they are read with the kill itself (the memcg fixture removes the cgroup, also on failure)."""
    limit = 40 * MiB
    cg = memcg(limit, swap=False)
    w = workload("hog", "256", "4", "10", cgroup=cg)
    assert w.wait_exit(30) == -9
    (kill,) = [k for k in read_oom_kills() if k.victim_pid == w.pid]
    assert kill.memcg_limit == limit
    assert limit - 4 * MiB <= kill.memcg_usage <= limit  # charging past the limit is what failed
    assert kill.memcg_failcnt >= 1
    if cg.version == 1:
        assert kill.memcg_memsw_usage >= kill.memcg_usage and kill.kmem_usage is not None
    assert kill.memcg_stat_path == cg.path
    stat = kill.memcg_stat
    anon = stat["total_rss"] if cg.version == 1 else stat["anon"]
    assert anon > limit // 2, stat  # the hog's anonymous memory, in bytes
    assert len(stat) > 20


def test_a_command_line_is_read_to_a_bound():
    """A target's argv is its own to make long (16 args of 100 KiB here; hundreds of MiB under an
    unlimited stack): memdiag keeps its first 64 KiB, the words it quotes among them."""
    import subprocess

    from memdiag.system.process import MAX_CMDLINE

    long_words = ["x" * (100 << 10)] * 16
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 30", "marker-first", *long_words])
    try:
        end = time.monotonic() + 10  # Popen returns before the child's exec has laid out its argv
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"/bin/sh"):
            assert time.monotonic() < end, "the shell did not start"
            time.sleep(0.01)
        got = read_process(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert got.cmdline[:4] == ["/bin/sh", "-c", "sleep 30", "marker-first"]
    assert sum(len(w) + 1 for w in got.cmdline) <= MAX_CMDLINE + 1
