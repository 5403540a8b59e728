"""Symbols from the file a process really maps, never from another file at the same path: real
processes in a private mount namespace (unshare -m) whose binary is another build than the
host's file of that path, binaries deleted or replaced after they started, and processes that
exited. Two builds of tests/workloads/twobuild.c name their function alpha_work and beta_work."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from containers import Image, podman
from kit import build
from memdiag.probes.elf import elf_info
from memdiag.probes.procmaps import AddressSpace
from memdiag.probes.stacks import Symbolizer

ALPHA, BETA = ["-DWHO=alpha"], ["-DWHO=beta"]


@contextlib.contextmanager
def running(argv: list[str]) -> Iterator[tuple[int, int]]:
    """The program started, its (pid, address of its work function); killed on the way out."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode().split()  # type: ignore[union-attr]
        if not line or line[0] != "ready":
            proc.kill()
            raise RuntimeError(f"{argv} did not start: {line} {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        yield int(line[1]), int(line[2], 16)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]


def function_at(pid: int, address: int) -> tuple[str | None, AddressSpace]:
    space = AddressSpace.of(pid)
    assert space is not None
    return Symbolizer(space).frame(address).function, space


def name_without_map_files(pid: int, address: int) -> str:
    """The same look-up from a process that lacks the capabilities /proc/PID/map_files needs
    (memdiag in a namespace without CAP_SYS_ADMIN): only maps' inode can match a path."""
    code = (
        "import sys; from memdiag.probes.procmaps import AddressSpace; from memdiag.probes.stacks import Symbolizer;"
        f"s = AddressSpace.of({pid}); f = Symbolizer(s).frame({address});"
        "print(f.function, '|', '; '.join(s.unmatched))"
    )
    caps = "-sys_admin,-checkpoint_restore"
    out = subprocess.run(
        ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@pytest.fixture
def place(tmp_path):
    """A directory whose file `prog` is, on the host, the beta build."""
    shutil.copy(build("twobuild", BETA), tmp_path / "prog")
    return tmp_path


def test_a_process_in_its_own_mount_namespace_is_named_from_its_own_build(place):
    path = place / "prog"
    alpha = build("twobuild", ALPHA)
    script = f"mount --bind {alpha} {path} && exec {path}"
    with running(["unshare", "-m", "--propagation", "private", "sh", "-c", script]) as (pid, address):
        assert function_at(pid, address)[0] == "alpha_work"
        # the host's file of that path is the other build: reading it would name beta's code
        host = elf_info(str(path))
        assert host.symbol_named("beta_work") and host.symbol_named("alpha_work") is None
        # its path through /proc/PID/root is its file, and maps' inode says so without map_files
        assert name_without_map_files(pid, address).startswith("alpha_work |")

        # now the namespace's path shows the beta build too (mounted over it after the start):
        # only map_files still opens what the process maps
        beta = str(build("twobuild", BETA))
        subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "--bind", beta, str(path)], check=True)
        inside = elf_info(f"/proc/{pid}/root{path}")
        assert inside.symbol_named("beta_work") and inside.symbol_named("alpha_work") is None
        name, space = function_at(pid, address)
        assert name == "alpha_work"
        assert space.file_path(space.find(address)).startswith(f"/proc/{pid}/map_files/")
        # without map_files no file on this host is the mapped one: unknown, and said why
        unknown = name_without_map_files(pid, address)
        assert unknown == f"None | {path}: no file on this host is the one PID {pid} maps"


def test_a_binary_deleted_or_replaced_after_its_start_is_read_through_map_files(tmp_path):
    path = tmp_path / "gone"
    shutil.copy(build("twobuild", ALPHA), path)
    with running([str(path)]) as (pid, address):
        path.unlink()
        name, space = function_at(pid, address)
        assert name == "alpha_work"
        assert space.find(address).deleted
        # another build now at the path (an upgrade on disk): the process still runs the old one
        shutil.copy(build("twobuild", BETA), path)
        assert function_at(pid, address)[0] == "alpha_work"
        kept = AddressSpace.of(pid)
    # the process has exited: its map_files went with it, and the file at its path is another
    # build: the frame stays unknown, with the reason counted, never beta_work
    symbolizer = Symbolizer(kept)
    frame = symbolizer.frame(address)
    assert frame.function is None and frame.module == str(path)
    assert symbolizer.failed == 1
    assert dict(kept.unmatched) == {f"{path}: no file on this host is the one PID {pid} maps": 1}


def test_a_file_at_the_same_path_is_used_when_it_is_the_mapped_one(tmp_path):
    """An ordinary process: its files are the host's, read by their own paths (one parse for
    every process), also once the process has exited."""
    path = tmp_path / "prog"
    shutil.copy(build("twobuild", ALPHA), path)
    with running([str(path)]) as (pid, address):
        name, space = function_at(pid, address)
        assert name == "alpha_work"
        assert space.file_path(space.find(address)) == str(path)
    # resolved afresh after the exit: maps' device and inode match the file at the path
    after = AddressSpace(pid, space.mappings, root=space.root)
    assert Symbolizer(after).frame(address).function == "alpha_work"
    assert after.file_path(after.find(address)) == str(path) and not after.unmatched


def test_a_container_is_named_from_its_own_files_also_when_its_image_file_is_replaced(podman_container):
    """A real podman container (overlayfs): its binary is read as it maps it, checked by build
    id, and after `podman cp` puts another build at its path inside the container (what its
    /proc/PID/root now shows), still from the mapped file."""
    with Image({"twobuild": build("twobuild", ALPHA)}) as image:
        c = podman_container("twobuild", image=image)
        address = int(c.logs().split()[2], 16)
        name, space = function_at(c.pid, address)
        assert name == "alpha_work"
        inside = f"/proc/{c.pid}/root/app/twobuild"
        # the overlay's file is not the mapped inode by number: it was taken for its build id
        assert space.file_path(space.find(address)) == inside
        # its libc is a copy of the host's: the same build, read by the host's path (parsed once),
        # but uprobes need the very inode the container maps, which the host's file is not
        libc = space.first_mapping_of(next(p for p in space.modules() if "/libc.so" in p))
        mapped = os.stat(f"/proc/{c.pid}/map_files/{libc.start:x}-{libc.end:x}")
        assert space.file_path(libc) == libc.path and os.stat(libc.path).st_ino != mapped.st_ino
        assert os.stat(space.inode_path(libc)).st_ino == mapped.st_ino
        podman("cp", str(build("twobuild", BETA)), f"{c.id}:/app/twobuild")
        assert elf_info(inside).symbol_named("beta_work") is not None
        name, space = function_at(c.pid, address)
        assert name == "alpha_work"
        assert space.file_path(space.find(address)).startswith(f"/proc/{c.pid}/map_files/")
