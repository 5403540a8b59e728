"""kmemstack names the code that leaves kernel slab outstanding, on the real kernel: lookups stats
a name that does not exist from find_config(), and the kernel keeps a negative dentry for each."""

import subprocess

from memdiag.diagnose.factset import namer
from memdiag.probes import kmemstack
from memdiag.system.target import Target

RATE = 1000  # lookups a second


def test_kmemstack_names_the_dentry_cache_the_kernel_site_and_find_config(workload, tmp_path):
    w = workload("lookups", str(tmp_path), str(RATE))
    r = kmemstack.run(Target.for_pid(w.pid), 4)
    assert r.status == "ok", r.reason
    assert all(v == 0 for v in r.lost.values()), r.lost
    top = r.stacks[0]
    functions = [f for f in top.functions if f]
    # a file system whose negative dentries die at once (tmpfs: always_delete_dentry) leaves none to find
    assert top.cache == "dentry", [(s.cache, s.count) for s in r.stacks]
    assert "find_config" in functions and top.method == "eh_frame", top
    assert "d_alloc_parallel" in top.kernel_functions and kmemstack.allocating_function(top.kernel_functions) in (
        "__d_alloc", "d_alloc")  # fmt: skip
    assert top.frees == 0 and top.accounted == top.allocs  # dentry is a SLAB_ACCOUNT cache
    # Each stat() of a new name takes one names_cache buffer (getname, freed before it returns) and
    # leaves one dentry: the dentries outstanding are the lookups made while the probe was armed.
    getname = next(s for s in r.stacks if s.cache == "names_cache" and "find_config" in s.functions)
    assert getname.count == 0 and abs(getname.allocs - top.count) <= 2, (getname.allocs, top.count)
    # The workload sleeps 10 ms after every RATE/100 lookups, so it makes a little fewer than RATE a
    # second (the lookups' own time and the sleeps' slack: 1-3% here); the probe is armed a few ms
    # before its window starts and disarmed a few ms after it ends: -15% / +3% holds both.
    expected = RATE * r.duration_s
    assert 0.85 * expected <= top.count <= 1.03 * expected + 10, (top.count, expected)
    facts = kmemstack.facts_of(r, None, namer())
    assert (facts["kmemstack.top_cache"], facts["kmemstack.top_function"]) == ("dentry", "find_config")
    assert facts["kmemstack.top_count"] == top.count and facts["kmemstack.top_bytes"] == top.bytes > 0
    assert r.cost.bpf_run_ns is None or r.cost.bpf_run_count >= r.allocs


def test_kmemstack_counts_nothing_of_another_processs_lookups(workload, tmp_path):
    workload("lookups", str(tmp_path), "2000")  # the lookups are another process's
    idle = subprocess.Popen(["sleep", "30"])
    try:
        r = kmemstack.run(Target.for_pid(idle.pid), 2)
    finally:
        idle.kill()
        idle.wait()
    assert r.status == "ok", r.reason
    assert r.allocs == 0 and r.stacks == [], [(s.cache, s.count, s.functions) for s in r.stacks]
