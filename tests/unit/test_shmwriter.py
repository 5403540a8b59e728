"""shmwriter's matching of what was made against what is still there, on real files in a tmpfs
(/dev/shm) and in a folder of another filesystem: a file unlinked, one on no tmpfs, one whose path
was cut are not still there; the place is the mount and the name's pattern, as system/tmpfs.py says."""

import os
import re
import shutil
import time
import uuid
from pathlib import Path

import pytest
from memdiag.probes import shmwriter
from memdiag.probes.shmwriter import KINDS, Looker, Made, There, file_place, match, tmpfs_mount

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def folders():
    name = f"memdiag-test-{uuid.uuid4().hex[:8]}"
    shm, disk = Path("/dev/shm") / name, Path("/var/tmp") / name
    shm.mkdir()
    disk.mkdir()
    yield shm, disk
    shutil.rmtree(shm, ignore_errors=True)
    shutil.rmtree(disk, ignore_errors=True)


def test_the_kinds_agree_with_the_header():
    text = (ROOT / "bpf" / "memdiag.h").read_text()
    body = re.search(r"enum shmw_kind \{(.*?)\};", text, re.S)[1]
    names = [c.strip().removeprefix("SHMW_KIND_").lower() for c in body.split(",") if c.strip()]
    assert tuple(names[:-1]) == KINDS and names[-1] == "count"


def test_the_mount_is_the_longest_tmpfs_prefix():
    mounts = [("/", "ext4"), ("/dev", "devtmpfs"), ("/dev/shm", "tmpfs"), ("/dev/shm/fuse", "fuse")]
    assert tmpfs_mount("/dev/shm/a/job-1.spool", mounts) == "/dev/shm"
    assert tmpfs_mount("/dev/shm/fuse/x", mounts) is None  # the deepest mount decides
    assert tmpfs_mount("/dev/shmx/y", mounts) is None
    assert file_place("/dev/shm/a/job-17.spool", "/dev/shm") == "/dev/shm/a/job-*.spool"


def _match(made: list[Made], since: int | None = None) -> tuple[dict[tuple, list[There]], int]:
    with Looker(None, since=since) as look:
        return match(made, look)


def test_only_what_is_still_on_tmpfs_is_matched(folders):
    shm, disk = folders
    me = os.getpid()
    kept = [shm / f"job-{i}.spool" for i in range(3)]
    for p in kept:
        p.write_bytes(b"x" * 8192)
    gone = shm / "job-9.spool"  # made, then unlinked by another process: not still there
    on_disk = disk / "job-5.spool"
    on_disk.write_bytes(b"x")
    made = [Made(kind="file", pid=me, key=("a",), path=str(p)) for p in kept]
    made += [
        Made(kind="file", pid=me, key=("b",), path=str(gone)),
        Made(kind="file", pid=me, key=("b",), path=str(on_disk)),
        Made(kind="file", pid=me, key=("b",), path=str(kept[0]), cut=True),
    ]
    by_key, unmatched = _match(made)
    assert set(by_key) == {("a",)} and unmatched == 3
    there = by_key[("a",)]
    assert [t.where for t in there] == [f"/dev/shm/{shm.name}/job-*.spool"] * 3
    assert all(t.bytes >= 8192 and t.mount == "/dev/shm" for t in there)
    with Looker(None) as look:
        assert look.files_there(me, f"/dev/shm/{shm.name}/job-*.spool") == 3


def test_a_link_planted_in_place_of_a_file_is_not_followed(folders):
    shm, disk = folders
    (disk / "big").write_bytes(b"x" * 65536)
    (shm / "job-1.spool").symlink_to(disk / "big")
    made = [Made(kind="file", pid=os.getpid(), key=("a",), path=str(shm / "job-1.spool"))]
    assert _match(made) == ({}, 1)


def test_a_memfd_is_there_while_its_descriptor_is_open():
    fd = os.memfd_create("frame-12")
    os.write(fd, b"x" * 16384)
    made = Made(kind="memfd", pid=os.getpid(), key=("m",), path="frame-12", id=fd)
    try:
        by_key, _ = _match([made])
        assert [t.where for t in by_key[("m",)]] == ["memfd:frame-*"] and by_key[("m",)][0].bytes >= 16384
    finally:
        os.close(fd)
    assert _match([made]) == ({}, 1)  # closed: gone


def test_a_link_to_a_folder_on_disk_is_not_followed(folders):
    """A folder of the path is a link the target planted to a folder of another filesystem: the
    lookup stays on the tmpfs mount, the disk file is neither matched nor counted (before: matched,
    its 300 KiB reported as tmpfs memory, and files_there counted it)."""
    shm, disk = folders
    (disk / "big-1.dat").write_bytes(b"x" * 300 * 1024)
    (shm / "link").symlink_to(disk)
    made = [Made(kind="file", pid=os.getpid(), key=("a",), path=str(shm / "link" / "big-1.dat"))]
    assert _match(made) == ({}, 1)
    with Looker(None) as look:
        assert look.files_there(os.getpid(), f"/dev/shm/{shm.name}/link/big-*.dat") is None


def test_a_dotdot_out_of_the_mount_is_not_followed(folders):
    shm, disk = folders
    (disk / "big-1.dat").write_bytes(b"x" * 65536)
    path = f"{shm}/../../../var/tmp/{disk.name}/big-1.dat"  # starts with /dev/shm: the mount is tmpfs's
    assert _match([Made(kind="file", pid=os.getpid(), key=("a",), path=path)]) == ({}, 1)


def test_a_file_there_before_the_trace_is_not_made_by_it(folders):
    """A file opened with O_CREAT that existed already (a consumer's open(path, "a")) is not one the
    trace saw made: born before the probe ran, it is not still there as the target's."""
    shm, _disk = folders
    old = shm / "job-1.spool"
    old.write_bytes(b"x" * 8192)
    time.sleep(0.05)  # past the coarse clock's tick (at most 10 ms): born before, as read
    since = shmwriter.realtime_coarse()
    new = shm / "job-2.spool"
    new.write_bytes(b"x" * 8192)
    made = [Made(kind="file", pid=os.getpid(), key=(p.name,), path=str(p)) for p in (old, new)]
    by_key, unmatched = _match(made, since=since)
    assert set(by_key) == {("job-2.spool",)} and unmatched == 1


def test_a_file_named_like_a_memfd_is_not_one():
    """A descriptor of a disk file at /memfd:NAME has a link text a memfd's would have: it is on no
    memfd's mount, so not matched (before: its blocks counted as the memfd's)."""
    name = f"frame-{uuid.uuid4().hex[:8]}"
    path = Path("/") / f"memfd:{name}"
    path.write_bytes(b"x" * 65536)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name}")
        assert _match([Made(kind="memfd", pid=os.getpid(), key=("m",), path=name, id=fd)]) == ({}, 1)
    finally:
        os.close(fd)
        path.unlink()
