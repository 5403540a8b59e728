"""Reading a file a target controls (system/safefile.py): inside its root, never through a link
that leaves it, never a FIFO or device, never past the bound. On a real tree built here, with both
the kernel's openat2 and the component walk that stands in for it on older kernels."""

from __future__ import annotations

import os

import pytest
from memdiag.system import safefile


@pytest.fixture(params=["openat2", "walk"])
def resolver(request, monkeypatch):
    if request.param == "walk":
        monkeypatch.setattr(safefile, "_have_openat2", False)
    else:
        monkeypatch.setattr(safefile, "_have_openat2", None)
    return request.param


@pytest.fixture()
def root(tmp_path):
    """A container root with the links and files an attacker plants, next to a 'host' secret."""
    (tmp_path / "host-secret").write_text("HOSTSECRET")
    r = tmp_path / "root"
    (r / "tmp").mkdir(parents=True)
    (r / "tmp" / "ok").write_text("inside")
    (r / "tmp" / "abs").symlink_to(tmp_path / "host-secret")  # absolute: resolved in the root, not here
    (r / "tmp" / "dots").symlink_to("../../host-secret")  # '..' stops at the root
    (r / "tmp" / "zero").symlink_to("/dev/zero")
    (r / "tmp" / "magic").symlink_to("/proc/self/root" + str(tmp_path / "host-secret"))
    (r / "tmp" / "rel").symlink_to("ok")
    os.mkfifo(r / "tmp" / "fifo")
    return r


def test_a_file_inside_the_root_is_read(root, resolver):
    assert safefile.read_in_root(root, "/tmp/ok", 100) == b"inside"


@pytest.mark.parametrize("name", ["abs", "dots", "zero", "magic", "fifo", "missing"])
def test_links_out_of_the_root_fifos_and_devices_are_refused(root, resolver, name):
    assert safefile.read_in_root(root, f"/tmp/{name}", 100) is None


def test_a_link_inside_the_root_is_followed_only_where_allowed(root, resolver):
    if resolver == "walk":  # the walk follows no link at all: stricter, never looser
        assert safefile.read_in_root(root, "/tmp/rel", 100) is None
    else:
        assert safefile.read_in_root(root, "/tmp/rel", 100) == b"inside"
    assert safefile.read_in_root(root, "/tmp/rel", 100, follow_leaf=False) is None


def test_the_owner_is_checked_where_asked(root, resolver):
    mine = os.getuid()
    assert safefile.read_in_root(root, "/tmp/ok", 100, owner=mine) == b"inside"
    assert safefile.read_in_root(root, "/tmp/ok", 100, owner=mine + 4242) is None


def test_a_read_is_bounded_and_says_so(root):
    (root / "tmp" / "big").write_bytes(b"a" * 1000 + b"END")
    rfd = safefile.open_root(root)
    fd = safefile.open_in(rfd, "/tmp/big")
    os.close(rfd)
    try:
        data, truncated = safefile.read_fd(fd, 100)
        assert (len(data), truncated) == (100, True)
        data, truncated = safefile.read_fd(fd, 100, tail=True)
        assert data.endswith(b"END") and truncated
    finally:
        os.close(fd)


def test_a_process_root_resolves_the_targets_links_in_its_own_root(tmp_path):
    """Through /proc/self/root (a real process's root, here memdiag's own) the reader sees the
    same files a plain open does: the in-root resolution changes nothing for a host process."""
    (tmp_path / "f").write_text("x")
    assert safefile.read_in_root(safefile.proc_root(os.getpid()), str(tmp_path / "f"), 10) == b"x"


def test_a_folder_is_looked_through_to_a_bound(tmp_path):
    """A target's /tmp is its own to fill: the names memdiag looks for, among the first entries only."""
    for i in range(50):
        (tmp_path / f"hsperfdata_u{i}").mkdir()
        (tmp_path / f"other{i}").touch()
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert sorted(safefile.names_in(fd, "hsperfdata_")) == sorted(f"hsperfdata_u{i}" for i in range(50))
        some = safefile.names_in(fd, "", limit=30)
        assert len(some) == 30 and set(some) <= {p.name for p in tmp_path.iterdir()}
        assert len(safefile.names_in(fd, "hsperfdata_", limit=30)) <= 30
    finally:
        os.close(fd)
