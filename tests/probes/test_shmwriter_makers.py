"""shmwriter names who makes the shared memory that stays, on the real kernel: a spooler whose failed
jobs leave their tmpfs file behind (one in two), a renderer whose failed frames keep their memfd open,
a publisher whose unconsumed frames keep their System V segment; each against what is on the host at
the end, and a cgroup target whose process is named through the cgroup."""

import ctypes
from pathlib import Path

import pytest
from memdiag.diagnose.culprit import split_frame
from memdiag.probes import shmwriter
from memdiag.system.target import Target


def _name(frames, _forwards):
    return split_frame(next(f for f in frames if "libc" not in f))[0]


def _functions(stack) -> list[str]:
    return [f for f in stack.functions if f]


@pytest.fixture
def segments_removed():
    """The System V segments of the processes handed to it, removed at the end even on failure."""
    makers: list[int] = []
    yield makers.append
    libc = ctypes.CDLL(None)
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    cols = lines[0].split()
    for line in lines[1:]:
        row = dict(zip(cols, line.split(), strict=False))
        if int(row["cpid"]) in makers:
            libc.shmctl(int(row["shmid"]), 0, None)  # IPC_RMID


# shm_dir before workload, here and below: the spooler is stopped before its folder is removed
@pytest.mark.parametrize("target", ["pid", "cgroup"])
def test_the_spool_files_still_there_are_named_by_their_maker(shm_dir, workload, memcg, target):
    cg = memcg(None)
    w = workload("spooler", str(shm_dir), "50", "16384", "2", cgroup=cg)
    where = f"/dev/shm/{shm_dir.name}/job-*.spool"
    t = Target.for_pid(w.pid) if target == "pid" else Target.for_cgroup(cg.location)
    r = shmwriter.run(t, 4, pattern=where)
    assert r.status == "ok", r.reason
    on_disk = {p.name for p in shm_dir.iterdir()}
    top = r.stacks[0]
    assert top.kind == "file" and "spool_job" in _functions(top) and top.pid == w.pid and top.comm == "spooler"
    assert top.where == where and top.remaining > 20 and top.removed > 20  # half unlinked as it went
    assert abs(top.created - top.removed - top.remaining) <= 2  # made = unlinked + still there (a job in flight)
    assert top.bytes == top.remaining * 16384
    place = r.places[0]
    assert (place.where, place.pid, place.remaining) == (where, w.pid, top.remaining)
    assert place.remaining <= place.there <= len(on_disk)  # the folder's files at the end (more made since)
    facts = shmwriter.facts_of(r, None, _name)
    assert (facts["shmwriter.top_function"], facts["shmwriter.top_process"]) == ("spool_job", f"PID {w.pid} (spooler)")
    assert facts["shmwriter.top_where"] == where and facts["shmwriter.top_there"] == place.there


def test_a_pattern_asked_about_that_nothing_made_names_no_one(shm_dir, workload):
    w = workload("spooler", str(shm_dir), "50", "16384", "2")
    r = shmwriter.run(Target.for_pid(w.pid), 2, pattern=f"/dev/shm/{shm_dir.name}/other-*.tmp")
    facts = shmwriter.facts_of(r, None, _name)
    assert facts["shmwriter.top_remaining"] == 0 and "shmwriter.top_function" not in facts
    assert facts["shmwriter.remaining"] > 0  # its spool files are still seen, just not the place asked about


def test_memfds_left_open_and_segments_left_behind_are_named(workload, segments_removed):
    m = workload("memfdleak", "20", "65536", "2")
    s = workload("sysvleak", "20", "65536", "2")
    segments_removed(s.pid)
    rm, rs = shmwriter.run(Target.for_pid(m.pid), 3), shmwriter.run(Target.for_pid(s.pid), 3)
    fm, fs = shmwriter.facts_of(rm, None, _name), shmwriter.facts_of(rs, None, _name)
    assert (
        fm["shmwriter.memfd_function"] == "render_frame" and fm["shmwriter.memfd_process"] == f"PID {m.pid} (memfdleak)"
    )
    assert fm["shmwriter.memfd_stack_remaining"] >= 20 and fm["shmwriter.memfd_stack_bytes"] >= 20 * 65536
    assert rm.places[0].where == "memfd:frame-*"
    assert fs["shmwriter.sysv_function"] == "publish_frame" and fs["shmwriter.sysv_stack_remaining"] >= 20
    assert rs.places[0].where == "System V IPC_PRIVATE" and rs.places[0].bytes >= 20 * 65536
    mine = [line.split() for line in Path("/proc/sysvipc/shm").read_text().splitlines()[1:]]
    assert fs["shmwriter.sysv_remaining"] <= sum(1 for row in mine if int(row[4]) == s.pid)
