"""Fact parsers on fixture text in the kernel's documented formats (no kernel needed)."""

from memdiag.system.kmsg import parse_kmsg_line, parse_kmsg_records
from memdiag.system.meminfo import parse_meminfo
from memdiag.system.process import parse_process, read_rss_anon
from memdiag.system.psi import parse_psi, read_psi_file
from memdiag.system.slab import PAGE_SIZE, parse_slabinfo
from memdiag.system.swaps import parse_swaps
from memdiag.system.vmstat import parse_vmstat

MEMINFO = """MemTotal:       24576000 kB
MemFree:         1000000 kB
MemAvailable:    2000000 kB
Buffers:           10000 kB
Cached:           900000 kB
SwapCached:            0 kB
AnonPages:      20000000 kB
Shmem:              4000 kB
Slab:             300000 kB
SReclaimable:     200000 kB
SUnreclaim:       100000 kB
SwapTotal:       1048572 kB
SwapFree:         524286 kB
CommitLimit:    13336572 kB
Committed_AS:   30000000 kB
"""


def test_meminfo_in_bytes_and_derived():
    m = parse_meminfo(MEMINFO)
    assert m.mem_available == 2000000 * 1024
    assert m.sunreclaim == 100000 * 1024
    assert m.swap_used == (1048572 - 524286) * 1024
    assert round(m.available_percent, 2) == round(100 * 2000000 / 24576000, 2)


def test_meminfo_missing_field_is_none_not_zero():
    m = parse_meminfo("MemTotal: 1000 kB\nMemFree: 10 kB\n")  # a pre-3.14 kernel: no MemAvailable
    assert m.mem_available is None
    assert m.available_percent is None
    assert m.mem_free == 10240


def test_vmstat_sums_allocstall_zones_and_omits_unknown():
    v = parse_vmstat("pswpin 5\npswpout 7\nallocstall_dma32 2\nallocstall_normal 3\npgmajfault 11\n")
    assert v.get("pswpin") == 5
    assert v.get("allocstall") == 5
    assert v.get("pgscan_direct") is None  # not in this kernel's vmstat: unknown, not 0


def test_psi_lines(tmp_path):
    p = parse_psi(
        "some avg10=12.50 avg60=3.00 avg300=0.75 total=123456\nfull avg10=6.25 avg60=1.00 avg300=0.20 total=654\n"
    )
    assert p.some.avg10 == 12.5 and p.some.total_us == 123456
    assert p.full.avg300 == 0.2
    assert read_psi_file(tmp_path / "absent") is None


def test_swaps_unescapes_names():
    devices = parse_swaps(
        "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
        "/var/tmp/my\\040swap                      file\t\t1048572\t\t2048\t\t-2\n"
    )
    assert devices[0].filename == "/var/tmp/my swap"
    assert devices[0].size == 1048572 * 1024 and devices[0].used == 2048 * 1024
    assert devices[0].priority == -2


def test_slabinfo():
    caches = parse_slabinfo(
        "slabinfo - version: 2.1\n"
        "# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> "
        "<batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n"
        "dentry            12000  12600    192   21    1 : tunables    0    0    0 : slabdata    600    600      0\n"
        "kmalloc-4k          800    816   4096    8    8 : tunables    0    0    0 : slabdata    102    102      0\n"
    )
    assert [c.name for c in caches] == ["dentry", "kmalloc-4k"]
    assert caches[1].size_bytes == 102 * 8 * PAGE_SIZE


def test_process_comm_with_spaces_and_parens():
    status = "Name:\tweird (x)\nState:\tS (sleeping)\nVmSize:\t 2048 kB\nVmHWM:\t 1500 kB\nVmRSS:\t 1024 kB\n"
    status += "RssAnon:\t 512 kB\nRssFile:\t 500 kB\nRssShmem:\t 12 kB\nVmSwap:\t 0 kB\nThreads:\t3\n"
    stat = "77 (weird (x)) S 1 77 77 0 -1 4194560 150 0 2 0 0 0 0 0 20 0 3 0 4242 2097152 256 " + " ".join(["0"] * 30)
    p = parse_process(77, status, stat, "Rss: 1024 kB\nPss: 900 kB\n", "/usr/bin/weird\0--flag\0")
    assert p.comm == "weird (x)"
    assert p.state == "S"
    assert p.rss == 1024 * 1024 and p.rss_anon == 512 * 1024 and p.rss_shmem == 12 * 1024
    assert p.minflt == 150 and p.majflt == 2
    assert p.threads == 3 and p.start_ticks == 4242
    assert p.pss == 900 * 1024
    assert p.cmdline == ["/usr/bin/weird", "--flag"]


def test_rss_anon_alone_from_status(tmp_path):
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "status").write_text("Name:\tgocache\nVmRSS:\t 2048 kB\nRssAnon:\t 1536 kB\n")
    assert read_rss_anon(77, tmp_path) == 1536 * 1024
    assert read_rss_anon(78, tmp_path) is None  # gone
    (tmp_path / "2").mkdir()
    (tmp_path / "2" / "status").write_text("Name:\tkthreadd\n")
    assert read_rss_anon(2, tmp_path) is None  # a kernel thread has no such line


def test_kernel_thread_has_no_rss():
    p = parse_process(2, "Name:\tkthreadd\nState:\tS (sleeping)\nThreads:\t1\n", None, None, "")
    assert p.rss is None and p.cmdline == []


# Records as this 6.18 kernel printed them for a v1 memcg OOM kill (trimmed to the lines read).
MEMCG_OOM = [
    (297.05, "hog invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0"),
    (297.05, "CPU: 1 UID: 0 PID: 3670 Comm: hog Not tainted 6.18.44 #1"),
    (297.06, "memory: usage 65536kB, limit 65536kB, failcnt 12"),
    (
        297.063946,
        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/mdtest,"
        "task_memcg=/mdtest,task=hog,pid=3670,uid=0",
    ),
    (
        297.063973,
        "Memory cgroup out of memory: Killed process 3670 (hog) total-vm:68044kB, anon-rss:65280kB, "
        "file-rss:1344kB, shmem-rss:0kB, UID:0 pgtables:172kB oom_score_adj:0",
    ),
]


def test_kmsg_memcg_oom_kill():
    (kill,) = parse_kmsg_records(MEMCG_OOM)
    assert kill.victim_pid == 3670 and kill.victim_comm == "hog"
    assert kill.cgroup_oom and kill.oom_memcg == "/mdtest" and kill.task_memcg == "/mdtest"
    assert kill.trigger_comm == "hog" and kill.trigger_pid == 3670
    assert kill.anon_rss == 65280 * 1024 and kill.file_rss == 1344 * 1024
    assert kill.when == 297.063973


def test_kmsg_system_oom_with_other_trigger():
    records = [
        (10.0, "java invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0"),
        (10.0, "CPU: 0 PID: 900 Comm: java Not tainted 5.15.0 #1"),
        (
            10.1,
            "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
            "task_memcg=/system.slice/db.service,task=postgres,pid=1200,uid=107",
        ),
        (
            10.1,
            "Out of memory: Killed process 1200 (postgres) total-vm:900kB, anon-rss:800kB, file-rss:0kB, "
            "shmem-rss:0kB, UID:107 pgtables:100kB oom_score_adj:0",
        ),
    ]
    (kill,) = parse_kmsg_records(records)
    assert not kill.cgroup_oom and kill.constraint == "CONSTRAINT_NONE"
    assert kill.victim_pid == 1200 and kill.trigger_pid == 900 and kill.trigger_comm == "java"
    assert kill.task_memcg == "/system.slice/db.service"


def test_kmsg_record_line():
    assert parse_kmsg_line("6,1234,297063973,-;Memory cgroup out of memory: Killed process 1 (x)\n SUBSYSTEM=x") == (
        297.063973,
        "Memory cgroup out of memory: Killed process 1 (x)",
    )
    assert parse_kmsg_line("garbage without separator") is None
