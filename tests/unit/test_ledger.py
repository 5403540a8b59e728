"""Ledgers: each line is the kernel counter it says it is, the lines sum to the total with the residual
a line of its own, a line the source cannot give is unknown (not zero), and every ledger fact the
catalog lists is produced by a window that reads the lines (v1 and v2 cgroups)."""

import os
from pathlib import Path

from memdiag.diagnose.culprit import default_classes
from memdiag.diagnose.factset import window_facts
from memdiag.diagnose.ledgers import anon_split_facts, build_ledgers, new_segments, shares_meaningful
from memdiag.diagnose.observe import ClosingRead, Observation
from memdiag.diagnose.snapshot import Snapshot
from memdiag.system.cgroup import CgroupMemory
from memdiag.system.fds import fd_type, read_memfds
from memdiag.system.kmsg import parse_kmsg_line, parse_kmsg_records
from memdiag.system.ledger import (
    KERNEL_STACK_BYTES,
    AnonPart,
    anon_split,
    cgroup_ledger,
    host_ledger,
    ledger_fact_defs,
    oom_cgroup_ledger,
    process_ledger,
)
from memdiag.system.meminfo import parse_meminfo
from memdiag.system.process import ProcessMemory, parse_process
from memdiag.system.smaps import split_smaps
from memdiag.system.sockdiag import SocketMemory
from memdiag.system.sysvshm import ShmSegment, parse_sysvipc_shm
from memdiag.system.target import Target
from memdiag.system.tmpfs import FilePattern, ShmMount, name_pattern
from memdiag.system.vmstat import VmStat

KiB, MiB = 1 << 10, 1 << 20

# This machine's /proc/meminfo (6.18, 24 GiB), the lines a ledger reads
MEMINFO = """MemTotal:       24683772 kB
MemFree:        21349396 kB
MemAvailable:   24111000 kB
Buffers:           74496 kB
Cached:          2723348 kB
SwapCached:            0 kB
Active(file):    1638172 kB
Inactive(file):  1149280 kB
AnonPages:          4192 kB
Shmem:             10388 kB
Slab:             422272 kB
SReclaimable:     368560 kB
SUnreclaim:        53712 kB
KernelStack:        1808 kB
PageTables:         1588 kB
SecPageTables:         0 kB
VmallocUsed:       14652 kB
Percpu:             1312 kB
Hugetlb:               0 kB
Zswap:                 0 kB
"""

# A v1 cgroup's memory.stat as this machine's 6.18 writes it (hierarchical total_* lines)
V1_STAT = {
    "total_cache": 200 * MiB,
    "total_rss": 6 * MiB,
    "total_shmem": 1 * MiB,
    "total_active_file": 3 * MiB,
    "total_inactive_file": 190 * MiB,
    "total_workingset_refault_file": 12,
}

# v2's memory.stat keys as Documentation/admin-guide/cgroup-v2.rst lists them (5.18+ has `kernel`);
# the figures are made up to add up
V2_STAT = {
    "anon": 40 * MiB,
    "file": 100 * MiB,
    "kernel": 12 * MiB,
    "kernel_stack": 1 * MiB,
    "pagetables": 2 * MiB,
    "sec_pagetables": 0,
    "percpu": 1 * MiB,
    "sock": 3 * MiB,
    "vmalloc": 1 * MiB,
    "shmem": 10 * MiB,
    "zswap": 0,
    "slab_reclaimable": 4 * MiB,
    "slab_unreclaimable": 2 * MiB,
    "active_file": 30 * MiB,
    "inactive_file": 55 * MiB,
    "workingset_refault_file": 7,
}


def _parts_sum(led) -> int:
    return sum(line.bytes for line in led.lines if line.bytes is not None)


def test_host_ledger_is_meminfo_line_by_line_with_what_no_counter_names_as_residual():
    m = parse_meminfo(MEMINFO)
    led = host_ledger(m)
    v = {line.key: line.bytes for line in led.lines}
    assert v["anon"] == 4192 * KiB and v["shmem"] == 10388 * KiB and v["free"] == 21349396 * KiB
    # Cached counts Shmem, and Active/Inactive(file) count Buffers: each page in one line
    assert v["file_other"] == (74496 + 2723348 - 10388 - 1638172 - 1149280) * KiB
    assert v["slab_reclaimable"] == 368560 * KiB
    assert v["vmalloc"] == (14652 - 1808) * KiB  # less the thread stacks it maps, which KernelStack counts
    assert led.residual == (90708 + 1808) * KiB  # MemTotal less every named line, by hand
    assert _parts_sum(led) == led.total == 24683772 * KiB and not led.unknown


def test_v1_cgroup_ledger_says_kernel_memory_unsplit_and_working_set_beside():
    cg = CgroupMemory(version=1, path="/x", fs_path="/x", usage=209 * MiB, stat=V1_STAT, kmem_usage=2 * MiB)
    led = cgroup_ledger(cg)
    v = {line.key: line.bytes for line in led.lines}
    assert v["anon"] == 6 * MiB and v["shmem"] == 1 * MiB and v["file_inactive"] == 190 * MiB
    assert v["file_other"] == 6 * MiB and v["kernel"] == 2 * MiB
    assert "slab_reclaimable" not in v and "sock" not in v  # v1 has no such line: not a line, not zero
    assert led.residual == 1 * MiB and _parts_sum(led) == 209 * MiB
    assert led.value("working_set") == 19 * MiB  # usage minus inactive page cache


def test_v2_cgroup_ledger_splits_kernel_memory_and_names_what_an_older_kernel_cannot_say():
    cg = CgroupMemory(version=2, path="/x", fs_path="/x", usage=156 * MiB, stat=V2_STAT)
    led = cgroup_ledger(cg)
    v = {line.key: line.bytes for line in led.lines}
    assert v["anon"] == 40 * MiB and v["shmem"] == 10 * MiB and v["file_other"] == 5 * MiB
    assert v["kernel_other"] == 1 * MiB  # kernel less slab, stacks, page tables, percpu, vmalloc
    assert v["sock"] == 3 * MiB and led.residual == 1 * MiB and not led.unknown
    older = {k: n for k, n in V2_STAT.items() if k != "kernel"}  # before 5.18
    led = cgroup_ledger(CgroupMemory(version=2, path="/x", fs_path="/x", usage=156 * MiB, stat=older))
    assert led.value("kernel_other") is None and led.unknown == ["kernel_other"]
    assert led.residual == 2 * MiB  # what the unknown line holds is in the residual, and said to be


def test_process_ledger_is_rss_by_kind_with_kernel_memory_beside():
    status = "Name:\tworker\nVmRSS:\t  10240 kB\nRssAnon:\t 8192 kB\nRssFile:\t 1024 kB\nRssShmem:\t 1024 kB\n"
    status += "VmPTE:\t  96 kB\nThreads:\t4\n"
    p = parse_process(1, status, None, None, None)
    led = process_ledger(p, {"socket": 3, "total": 3})
    assert [line.key for line in led.lines] == ["anon", "file", "shmem", "residual"] and led.residual == 0
    assert led.value("page_tables") == 96 * KiB and led.value("kernel_stacks") == 4 * KERNEL_STACK_BYTES
    assert led.line("kernel_stacks").estimate and led.counts == {"socket": 3, "total": 3}


def test_an_oom_kill_ledger_is_the_kernels_report_of_the_cgroup():
    raw = (Path(__file__).parent / "data" / "kmsg_memcg_oom_v1_6.18.txt").read_text().splitlines()
    (kill,) = parse_kmsg_records([r for r in map(parse_kmsg_line, raw) if r is not None])
    led = oom_cgroup_ledger(kill)
    assert led.total == 64 * MiB and led.value("kernel") == 228 * KiB
    largest = max((line for line in led.lines if line.key != "residual"), key=lambda line: line.bytes or 0)
    assert largest.key == "anon" and largest.bytes > 0.95 * led.total  # python3 appending bytearrays


def test_descriptor_types_and_file_patterns():
    links = {
        "socket:[123]": "socket",
        "pipe:[9]": "pipe",
        "anon_inode:[eventfd]": "eventfd",
        "anon_inode:[eventpoll]": "epoll",
        "anon_inode:inotify": "inotify",
        "/memfd:cache (deleted)": "memfd",
        "/var/log/x.log": "file",
        "anon_inode:bpf-map": "other",
    }
    assert {link: fd_type(link) for link in links} == links
    assert name_pattern("job-1234.spool") == "job-*.spool"
    assert name_pattern("sess_3f2a9c0d1e2b.tmp") == "sess_*.tmp"


def _observation(cgroup_version: int) -> Observation:
    """A process in a cgroup over three samples, every ledger line moving: what the facts are made of."""
    stat = V2_STAT if cgroup_version == 2 else V1_STAT

    def snap(t: int) -> Snapshot:
        grown = {k: n + t * MiB for k, n in stat.items()}
        cg = CgroupMemory(
            version=cgroup_version, path="/x", fs_path="/x", usage=(300 + t) * MiB, stat=grown,
            kmem_usage=(2 + t) * MiB, kmem_tcp_usage=0,
        )  # fmt: skip
        proc = ProcessMemory(
            pid=7, comm="w", cmdline=["w"], rss=(10 + 2 * t) * MiB, rss_anon=(8 + t) * MiB, rss_file=MiB,
            rss_shmem=(1 + t) * MiB, vm_pte=(1 + t) * MiB, threads=2,
        )  # fmt: skip
        meminfo = parse_meminfo(MEMINFO.replace("Shmem:             10388", f"Shmem:       {10388 + t * 1024}"))
        fds = {"socket": 10 + t, "file": 3, "total": 13 + t}
        return Snapshot(t=float(t), wall=float(t), meminfo=meminfo, vmstat=VmStat(counters={}), process=proc,
                        cgroup=cg, fds=fds)  # fmt: skip

    def mount(used: int, files: int) -> ShmMount:
        pattern = FilePattern(pattern="job-*.spool", files=files, bytes=used)
        return ShmMount(mount_point="/dev/shm", used=used, patterns=[pattern], files=files)

    return Observation(
        target=Target(kind="pid", pid=7, comm="w", cmdline=["w"]), requested_s=3, started=0, ended=2,
        snapshots=[snap(t) for t in range(3)], shm_first=[mount(MiB, 1)], shm_last=[mount(3 * MiB, 3)],
        sockets_first=SocketMemory(sockets=10, buffers=KiB), sockets_last=SocketMemory(sockets=12, buffers=2 * KiB),
        memfds_last=[("memfd:cache", MiB)], sysv_first=[SEGMENTS[0]], sysv_last=SEGMENTS, sysv_unread=0,
        closing=_closing(),
    )  # fmt: skip


def _segment(shmid: int, cpid: int, size: int, key: int = 0, nattch: int = 0, rss: int | None = None,
             ctime: int = 0) -> ShmSegment:  # fmt: skip
    rss = size if rss is None else rss
    return ShmSegment(key=key, shmid=shmid, size=size, cpid=cpid, lpid=cpid, nattch=nattch, uid=0, rss=rss, ctime=ctime)


# one the target made before the window, two it made in it (one attached, half of it touched; one
# in each half of the window, 0 to 2 s), one another process made
SEGMENTS = [
    _segment(1, 7, 4 * MiB), _segment(2, 7, MiB), _segment(3, 7, 2 * MiB, 0x2A, 1, rss=MiB, ctime=2),
    _segment(4, 9, 8 * MiB),
]  # fmt: skip


def test_the_segments_the_target_made_in_the_window_are_named_by_creator():
    obs = _observation(2)
    assert [g.shmid for g in new_segments(obs)] == [3, 2]  # largest first; not shmid 1 (before), not 4 (another's)
    facts, counters, _t = window_facts(obs, obs.target, 2.0, None, {}, {}, {}, default_classes())
    assert [g.shmid for g in counters.sysv] == [3, 2]
    assert (facts["sysv.new_segments"], facts["sysv.top_creator"], facts["sysv.top_creator_segments"]) == (2, "7", 2)
    # the memory they hold (resident), as the ledger's shmem line counts them: not their size (3 MiB)
    assert (facts["sysv.top_creator_bytes"], facts["sysv.top_creator_held"]) == (2 * MiB, "resident")
    assert facts["sysv.top_creator_unattached"] == 1 and facts["sysv.new_bytes"] == 2 * MiB
    assert (facts["sysv.top_creator_early"], facts["sysv.top_creator_late"]) == (1, 1)
    assert facts["sysv.unread_processes"] == 0
    assert (facts["sysv.top_key"], facts["sysv.top_size"], facts["sysv.top_shmid"]) == ("0x2a", 2 * MiB, "3")
    whole = obs.model_copy(update={"target": Target(kind="system")})
    assert [g.shmid for g in new_segments(whole)] == [4, 3, 2]  # the whole system's: every creator's


def _closing() -> ClosingRead:
    """The process as the window closed: 12 MiB anonymous, of which a runtime's heap 4 MiB and the
    allocator's blocks in use 3 MiB, free chunks 2 MiB and unused top 1 MiB."""
    proc = ProcessMemory(
        pid=7, comm="w", cmdline=["w"], rss=15 * MiB, rss_anon=12 * MiB, rss_file=MiB, rss_shmem=2 * MiB
    )
    parts = [
        AnonPart(key="runtime_heap", label="heap", bytes=4 * MiB),
        AnonPart(key="allocator_in_use", label="in use", bytes=3 * MiB, estimate=True),
        AnonPart(key="allocator_free", label="free chunks", bytes=2 * MiB, estimate=True),
        AnonPart(key="allocator_top", label="top", bytes=MiB, estimate=True),
    ]
    return ClosingRead(
        t=2.5, process=proc, anon_after=12 * MiB + 4096, anon_parts=parts, anon_unread=["mmapped: not read"]
    )


def test_anonymous_memory_by_holder_adds_up_with_its_residual():
    split = build_ledgers(_observation(2))[0].anon_split
    assert split is not None and split.total == 12 * MiB and split.at_s == 2.5 and split.moved == 4096
    assert sum(p.bytes for p in split.parts) + split.residual == split.total  # parts + residual = anon
    assert split.residual == 2 * MiB and split.unread == ["mmapped: not read"]
    facts = anon_split_facts(split)
    assert facts["ledger.process.anon_allocator_free"] == 2 * MiB
    assert facts["ledger.process.anon_allocator_free_share"] == 100 * 2 / 12  # free chunks: 2 of 12 MiB
    assert facts["ledger.process.anon_runtime"] == 4 * MiB
    assert facts["ledger.process.anon_unattributed_share"] == 100 * 2 / 12


def test_a_holder_no_reader_said_is_unknown_not_zero():
    split = anon_split(10 * MiB, [], ["glibc malloc: not read"])
    assert split.residual == 10 * MiB  # all of it unattributed, said so
    facts = anon_split_facts(split)
    assert "ledger.process.anon_allocator_free" not in facts and "ledger.process.anon_runtime" not in facts
    assert facts["ledger.process.anon_unattributed"] == 10 * MiB
    unknown = anon_split(None, [AnonPart(key="allocator_free", label="free", bytes=MiB)], [])
    assert unknown.residual is None  # no total read: no residual, not the parts' negative
    assert "ledger.process.anon_unattributed" not in anon_split_facts(unknown)


def test_the_detail_carries_its_own_moment_and_totals():
    led = build_ledgers(_observation(2))[0]
    assert led.total_last == 14 * MiB  # the last sample's RSS ...
    assert led.detail_at_s == 2.5 and led.detail_totals["total"] == 15 * MiB  # ... and the detail's own
    assert led.detail_totals["anon"] == 12 * MiB


def test_every_ledger_fact_the_catalog_lists_is_produced():
    produced: set[str] = set()
    for version in (1, 2):
        obs = _observation(version)
        facts, _c, _t = window_facts(obs, obs.target, 2.0, None, {}, {}, {}, default_classes())
        produced |= set(facts)
    missing = {name for name, _k, _h in ledger_fact_defs()} - produced
    assert not missing


def test_shares_are_given_only_where_the_total_moved():
    led = {led.scope: led for led in build_ledgers(_observation(2))}
    assert shares_meaningful(led["process"])  # RSS grew by what its lines grew
    cg = led["cgroup"]  # each of its 16 lines grew 1 MiB a sample while usage grew 1 MiB: lines trading places
    assert not shares_meaningful(cg)


def test_system_v_segments_and_memfds_are_read_as_the_kernel_lists_them():
    header = "       key      shmid perms                  size  cpid  lpid nattch   uid   gid  cuid  cgid"
    header += "      atime      dtime      ctime                   rss                  swap"
    row = "  305441741         45  1600               8388608 23997 23997      0     0     0     0     0"
    row += "          0          0 1765106000               4194304                     0"
    (seg,) = parse_sysvipc_shm(f"{header}\n{row}\n")  # this machine's 6.18 columns
    assert (seg.key, seg.shmid, seg.size, seg.cpid, seg.nattch, seg.rss) == (0x1234ABCD, 45, 8 * MiB, 23997, 0, 4 * MiB)
    assert seg.ctime == 1765106000
    fd = os.memfd_create("ledger-test")
    try:
        os.write(fd, b"x" * (3 * 4096))
        memfds = read_memfds(os.getpid())
    finally:
        os.close(fd)
    assert ("memfd:ledger-test", 3 * 4096) in memfds


SMAPS = """55d4c6a00000-55d4c6c00000 rw-p 00000000 00:00 0                          [heap]
Rss:                2048 kB
Anonymous:          2048 kB
7f0000000000-7f0000400000 r-xp 00000000 08:01 1234                       /usr/lib/libc.so.6
Rss:                1024 kB
Anonymous:             0 kB
7f0000400000-7f0000410000 rw-p 00400000 08:01 1234                       /usr/lib/libc.so.6
Rss:                  64 kB
Anonymous:            16 kB
7f0001000000-7f0001800000 rw-s 00000000 00:01 77                         /memfd:frames (deleted)
Rss:                4096 kB
Anonymous:             0 kB
7f0002000000-7f0002100000 rw-p 00000000 00:00 0
Rss:                 512 kB
Anonymous:           512 kB
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
Rss:                   8 kB
Anonymous:             0 kB
"""


def test_rss_by_mapping_is_the_detail_of_the_process_lines():
    split = split_smaps(SMAPS)
    assert split["anon"] == [
        ("[heap] (the brk heap)", 2048 * KiB),
        ("anonymous mappings (mmap: thread stacks, arenas, runtime heaps)", 512 * KiB),
        ("private pages written in mapped files", 16 * KiB),
    ]
    assert split["file"] == [("/usr/lib/libc.so.6", (1024 + 48) * KiB)]  # its written pages are anonymous
    assert split["shmem"] == [("/memfd:frames", 4096 * KiB)]  # [vdso] is in no line


def test_a_fuse_mount_on_the_way_is_seen_at_above_and_with_below_under_the_path():
    from memdiag.system.cgroup import on_fuse, parse_mountinfo

    table = parse_mountinfo(
        "21 1 0:20 / / rw - overlay overlay rw\n"
        "22 21 0:21 / /tmp/hsperfdata_app rw - fuse.hang hang rw\n"
        "23 21 0:22 / /dev/shm rw - tmpfs tmpfs rw\n"
        "24 21 0:23 / /mnt/f rw - fuse.sshfs sshfs rw\n"
    )
    assert on_fuse(table, "/tmp", below=True)  # hsperfdata's path: a FUSE folder under /tmp
    assert not on_fuse(table, "/tmp")  # /tmp itself is reached without crossing it
    assert on_fuse(table, "/mnt/f/shm") and on_fuse(table, "/mnt/f")  # at or above the path
    assert not on_fuse(table, "/dev/shm") and not on_fuse(table, "/mnt/fx")  # a prefix of a name is no mount
