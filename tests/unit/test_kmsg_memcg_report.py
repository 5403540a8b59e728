"""The kernel's own account of a memory cgroup at an OOM kill (memory:/swap lines and memory.stat),
read from /dev/kmsg records into OomKill's memcg_* fields."""

from pathlib import Path

from memdiag.system.kmsg import MAX_STAT_KEYS, parse_kmsg_line, parse_kmsg_records

MiB = 1 << 20

# One whole memcg OOM report, the /dev/kmsg records verbatim as this machine's 6.18.44 kernel wrote them
# (cgroup v1, memory.limit_in_bytes 64 MiB, python3 appending 1 MiB bytearrays; read with cat /dev/kmsg).
V1_RECORDS = (Path(__file__).parent / "data" / "kmsg_memcg_oom_v1_6.18.txt").read_text().splitlines()


def _records(raw_lines):
    return [r for r in map(parse_kmsg_line, raw_lines) if r is not None]


def test_v1_report_as_this_kernel_printed_it():
    (kill,) = parse_kmsg_records(_records(V1_RECORDS))
    assert kill.victim_pid == 8070 and kill.victim_comm == "python3" and kill.trigger_pid == 8070
    assert kill.oom_memcg == "/oomledger-probe-7117"
    assert kill.memcg_usage == 64 * MiB and kill.memcg_limit == 64 * MiB and kill.memcg_failcnt == 94
    assert kill.memcg_memsw_usage == 64 * MiB and kill.memcg_swap_usage is None  # v1 prints memory+swap
    assert kill.kmem_usage == 228 * 1024
    assert kill.memcg_stat_path == "/oomledger-probe-7117"
    stat = kill.memcg_stat
    assert len(stat) == 42 and list(stat)[:3] == ["cache", "rss", "rss_huge"]  # in the kernel's order
    assert stat["rss"] == stat["total_rss"] == 66875392  # bytes, as memory.stat prints them
    assert stat["hierarchical_memory_limit"] == 64 * MiB
    assert stat["hierarchical_memsw_limit"] == 9223372036854771712  # "unlimited", as printed
    assert stat["pgfault"] == 23958  # events are counts
    assert "Tasks" not in " ".join(stat)  # the task table after the stats is not a stat


# Built from the kernel source, not captured (this machine has no cgroup v2 memory controller): the
# lines mm/memcontrol.c prints on v2 (mem_cgroup_print_oom_meminfo: "memory:", "swap:", then
# memcg_stat_format's memory_stats[] in bytes, "slab", "pgscan"/"pgsteal" and memcg_vm_event_stat[]
# counts, one printk a line by seq_buf_do_printk), between mm/oom_kill.c dump_header's first line and
# its summary and kill lines. The figures are made up.
V2_MESSAGES = [
    "worker invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "CPU: 3 UID: 0 PID: 5120 Comm: worker Not tainted 6.18.0 #1 PREEMPT(voluntary) ",
    "memory: usage 204800kB, limit 204800kB, failcnt 1234",
    "swap: usage 10240kB, limit 10240kB, failcnt 7",
    "Memory cgroup stats for /system.slice/app.service:",
    "anon 199229440",
    "file 4096000",
    "kernel 3145728",
    "kernel_stack 245760",
    "pagetables 614400",
    "sec_pagetables 0",
    "percpu 1440",
    "sock 0",
    "vmalloc 0",
    "shmem 0",
    "file_mapped 1638400",
    "file_dirty 0",
    "file_writeback 0",
    "swapcached 0",
    "anon_thp 0",
    "inactive_anon 199217152",
    "active_anon 12288",
    "inactive_file 2457600",
    "active_file 1638400",
    "unevictable 0",
    "slab_reclaimable 421888",
    "slab_unreclaimable 1081344",
    "slab 1503232",
    "workingset_refault_anon 12",
    "workingset_refault_file 340",
    "pgscan 51234",
    "pgsteal 20480",
    "pgfault 60211",
    "pgmajfault 35",
    "thp_fault_alloc 0",
    "Tasks state (memory values in pages):",
    "[  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name",
    "[   5120]     0  5120    60000    49000    48640      360         0   614400     2560             0 worker",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/system.slice/app.service,task_memcg=/system.slice/app.service,task=worker,pid=5120,uid=0",
    "Memory cgroup out of memory: Killed process 5120 (worker) total-vm:240000kB, anon-rss:194560kB, "
    "file-rss:1440kB, shmem-rss:0kB, UID:0 pgtables:600kB oom_score_adj:0",
]


def test_v2_report_in_the_format_of_the_kernel_source():
    (kill,) = parse_kmsg_records([(1.0, m) for m in V2_MESSAGES])
    assert kill.victim_pid == 5120 and kill.cgroup_oom
    assert kill.memcg_usage == kill.memcg_limit == 200 * MiB and kill.memcg_failcnt == 1234
    assert kill.memcg_swap_usage == 10 * MiB
    assert kill.memcg_memsw_usage is None and kill.kmem_usage is None  # v1's lines only
    assert kill.memcg_stat_path == "/system.slice/app.service"
    assert kill.memcg_stat["anon"] == 199229440 and kill.memcg_stat["slab"] == 1503232
    assert kill.memcg_stat["pgscan"] == 51234 and len(kill.memcg_stat) == 30


def test_a_system_oom_has_no_cgroup_account():
    records = [
        (5.0, "java invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0"),
        (5.0, "Mem-Info:"),
        (5.0, "active_anon:1000 inactive_anon:2000 isolated_anon:0"),
        (5.1, "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task=java"),
        (5.1, "Out of memory: Killed process 77 (java) total-vm:900kB, anon-rss:800kB, file-rss:0kB"),
    ]
    (kill,) = parse_kmsg_records(records)
    assert kill.memcg_usage is None and kill.memcg_limit is None and kill.memcg_stat_path is None
    assert kill.memcg_stat == {}


def test_each_kill_keeps_only_its_own_report():
    """A report cut short (no kill: an exiting task, or records lost) leaves nothing to the next
    report; the lines outside any report are nobody's."""
    first = [m for m in V2_MESSAGES if not m.startswith(("oom-kill:", "Memory cgroup out of memory"))]
    stray = ["memory: usage 1kB, limit 1kB, failcnt 1", "Memory cgroup stats for /stray:", "anon 1"]
    later = [
        "hog invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
        "Memory cgroup out of memory: Killed process 9 (hog) total-vm:1kB, anon-rss:1kB, file-rss:0kB",
    ]
    kills = parse_kmsg_records([(1.0, m) for m in [*first, *later, *stray, *V2_MESSAGES[-2:]]])
    assert [k.victim_pid for k in kills] == [9, 5120]
    for k in kills:
        assert k.memcg_usage is None and k.memcg_stat == {} and k.memcg_stat_path is None


def test_what_is_kept_is_bounded():
    head, tail = V2_MESSAGES[:5], V2_MESSAGES[-2:]
    many = [f"key_{i} {i}" for i in range(10 * MAX_STAT_KEYS)]
    odd = ["Anon 1", "anon -1", "anon 1x", "anon " + "9" * 21, "k" * 65 + " 1", "anon  1", "slab 5"]
    (kill,) = parse_kmsg_records([(1.0, m) for m in [*head, *odd, *many, *tail]])
    assert list(kill.memcg_stat) == ["slab", *(f"key_{i}" for i in range(MAX_STAT_KEYS - 1))]
    assert kill.memcg_stat["slab"] == 5


def test_a_whole_memory_stat_printed_as_one_record_is_read_line_by_line():
    """Before 6.4 the kernel printed the OOM cgroup's memory.stat with one printk: one /dev/kmsg record,
    its newlines escaped as \\x0a. Joined so, this kernel's report reads as it did line by line."""
    records = _records(V1_RECORDS)
    head = next(i for i, (_w, m) in enumerate(records) if m.startswith("Memory cgroup stats for"))
    end = next(i for i, (_w, m) in enumerate(records) if m.startswith("Tasks state"))
    joined = "\\x0a".join(m for _w, m in records[head + 1 : end])
    (kill,) = parse_kmsg_records([*records[: head + 1], (records[head + 1][0], joined), *records[end:]])
    (whole,) = parse_kmsg_records(records)
    assert kill.memcg_stat == whole.memcg_stat and len(kill.memcg_stat) == 42


def test_a_comm_with_an_escaped_newline_does_not_hide_its_kill():
    """A comm may hold a newline (PR_SET_NAME), which /dev/kmsg writes as \\x0a: the victim's line is
    matched whole, never split there (only a memory.stat printed as one record is)."""
    records = [(r[0], r[1].replace("(python3)", "(py\\x0athon)")) for r in _records(V1_RECORDS)]
    (kill,) = parse_kmsg_records(records)
    assert kill.victim_pid == 8070 and kill.victim_comm == "py\\x0athon" and len(kill.memcg_stat) == 42
