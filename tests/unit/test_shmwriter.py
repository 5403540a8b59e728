"""shmwriter's matching of what was made against what is still there, on real files in a tmpfs
(/dev/shm) and in a folder of another filesystem: a file unlinked, one on no tmpfs, one whose path
was cut are not still there; the place is the mount and the name's pattern, as system/tmpfs.py says."""

import os
import re
import shutil
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


def _match(made: list[Made]) -> tuple[dict[tuple, list[There]], int]:
    with Looker(None) as look:
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
    assert shmwriter.files_there(me, f"/dev/shm/{shm.name}/job-*.spool") == 3


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
