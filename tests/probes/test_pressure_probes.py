"""oomkill, swapin, vmscan and drsnoop on real OOM kills and real swap pressure; a requirement the
kernel lacks (kprobes here) reports unavailable with its reason, and the fallback method runs where
the kernel has no kprobes (the assertions follow what the running kernel offers)."""

import threading

from kit import swapped_bytes, wait_until
from memdiag.probes import drsnoop, kernel, oomkill, swapin, vmscan
from memdiag.probes.base import Run, run_probe
from memdiag.probes.face import ProbeResult
from memdiag.system.target import Target

MiB = 1 << 20


def test_oomkill_catches_a_cgroup_oom(workload, memcg):
    cg = memcg(48 * MiB, swap=False)
    box, armed = {}, threading.Event()
    # 6 s: the hog is killed within a second of its start, and the probe runs its whole duration
    t = threading.Thread(target=lambda: box.setdefault("r", oomkill.run(Target(kind="system"), 6, ready=armed)))
    t.start()
    assert armed.wait(60)
    w = workload("hog", "512", "8", "20", cgroup=cg)
    assert w.wait_exit(30) == -9
    t.join()
    r = box["r"]
    assert r.status == "ok", r.reason
    kills = [k for k in r.kills if k.victim_pid == w.pid]
    assert len(kills) == 1
    k = kills[0]
    assert k.victim_comm == "hog" and k.trigger_pid == w.pid
    assert k.cgroup_oom is True and k.constraint == "CONSTRAINT_MEMCG"
    assert k.memcg == cg.path and k.limit == 48 * MiB
    assert 30 * MiB < k.anon_rss <= 48 * MiB
    assert k.mem_available > 1 << 30  # the host had memory to spare
    assert any("out_of_memory" in f for f in k.trigger_kernel_stack)


# oom:mark_victim as kernels before 6.8 have it (Debian 12's 6.1): the victim's pid alone, the
# raw tracepoint's argument a bare pid, not its task
MARK_VICTIM_6_1 = """name: mark_victim
ID: 540
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int pid;\toffset:8;\tsize:4;\tsigned:1;

print fmt: "pid=%d", REC->pid
"""


def test_oomkill_built_for_a_tracepoint_with_the_pid_alone_completes_kills_from_the_kernel_log(workload, memcg):
    """The branch older kernels take, run here: built as for 6.1's pid-only tracepoint, the probe
    gets the victim's comm, RSS, constraint and cgroup from the kernel log and the cgroup files."""
    options = oomkill.build_options(MARK_VICTIM_6_1)
    assert options == {}  # no comm, no RSS, no task argument to translate pids from
    cg = memcg(48 * MiB, swap=False)
    box, armed = {}, threading.Event()
    t = threading.Thread(
        target=lambda: box.setdefault("r", oomkill.run(Target(kind="system"), 6, ready=armed, options=options))
    )
    t.start()
    assert armed.wait(60)
    w = workload("hog", "512", "8", "20", cgroup=cg)
    assert w.wait_exit(30) == -9
    t.join()
    r = box["r"]
    assert r.status == "ok", r.reason
    k = next(k for k in r.kills if k.victim_pid == w.pid)
    assert k.victim_comm == "hog" and k.trigger_pid == w.pid  # the comm from the kernel log
    assert k.cgroup_oom is True and k.constraint == "CONSTRAINT_MEMCG" and k.memcg == cg.path
    assert 30 * MiB < k.anon_rss <= 48 * MiB  # the log's anon-rss, not the tracepoint's


def test_swap_pressure_seen_by_swapin_vmscan_drsnoop(swap, workload, memcg):
    cg = memcg(96 * MiB)
    w = workload("hog", "256", "8", "10", cgroup=cg)
    wait_until(lambda: swapped_bytes(w.pid) >= 8 * MiB, "the hog swapping")  # past its 96 MiB
    s = swapin.run(Target.for_pid(w.pid), 3)
    assert s.status == "ok", s.reason
    assert "major page faults on anonymous memory" in s.method
    kprobes = kernel.kprobes()  # the method follows what this kernel offers
    if kprobes.available:
        assert s.method.startswith("kprobe on the kernel's swap read (swap_read"), s.method
    else:
        assert f"kprobes unavailable: {kprobes.reason}" in s.method  # the fallback, and it says so
    hog = [p for p in s.processes if p.pid == w.pid][0]
    assert hog.comm == "hog" and hog.swapins > 500 and hog.cgroup == cg.path
    assert hog.regions and hog.regions[0].mapping in ("anon", "[heap]")
    assert str(swap) in [d.filename for d in s.swap_devices]

    v = vmscan.run(Target(kind="system"), 3)
    memcg_reclaim = [x for x in v.reclaim if x.kind == "memcg"][0]
    assert memcg_reclaim.events > 50 and memcg_reclaim.pages_reclaimed > 1000
    assert sum(memcg_reclaim.histogram_us.values()) == memcg_reclaim.events  # read after detaching

    d = drsnoop.run(Target.for_cgroup(cg.location), 3)
    mine = [p for p in d.processes if p.pid == w.pid]
    assert mine and mine[0].comm == "hog" and mine[0].memcg_count > 50 and mine[0].total_ms > 0


def test_swapon_calls_are_seen(root_required):
    from kit import swapfile

    box, armed = {}, threading.Event()
    t = threading.Thread(target=lambda: box.setdefault("r", swapin.run(Target(kind="system"), 4, ready=armed)))
    t.start()
    assert armed.wait(60)
    with swapfile(64 * MiB) as path:
        pass
    t.join()
    calls = [(c.call, c.path) for c in box["r"].swap_calls]
    assert ("swapon", str(path)) in calls and ("swapoff", str(path)) in calls


def test_swapins_kprobe_path_runs_whatever_the_kernel_offers(swap, workload, memcg):
    """The kprobe method's code runs on every kernel: forced here, where the kernel has no kprobes,
    it compiles the kprobe program, tries the attach with the kernel's real argument types (a str
    where bytes are wanted crashed it on every kernel with kprobes) and, refused, keeps counting
    swap-ins by major faults and says why; where kprobes exist it counts the kernel's swap reads."""
    cg = memcg(64 * MiB)
    w = workload("hog", "160", "16", "20", cgroup=cg)
    wait_until(lambda: swapped_bytes(w.pid) > 8 * MiB, "the hog's pages in swap")
    r = swapin.run(Target.for_pid(w.pid), 3, use_kprobe=True)
    assert r.status == "ok", r.reason
    hog = next(p for p in r.processes if p.pid == w.pid)
    assert hog.swapins > 0
    if kernel.kprobes().available:
        assert r.method.startswith("kprobe on the kernel's swap read (swap_read"), r.method
    else:
        assert "kprobe on swap_read" in r.method and "not attached" in r.method and "PMU" in r.method, r.method


def test_a_missing_requirement_is_unavailable_with_its_reason():
    kprobes = kernel.kprobes()
    # kprobes where this kernel lacks them (6.18 here); elsewhere a requirement no kernel meets
    missing = kprobes if not kprobes.available else kernel.Availability(available=False, reason="no such feature")
    r = run_probe(
        Run(
            "needs-kprobes",
            ProbeResult,
            [missing],
            {},
            lambda bpf, elapsed: {},
            "kprobe",
        ),
        Target(kind="system"),
        1,
    )
    assert r.status == "unavailable"
    assert missing.reason in r.reason
