"""Containers as targets, with a real runtime: podman (runc, cgroupfs) running an image built on
this machine from the workload kit's binaries (tests/containers.py), diagnosed by the real memdiag
CLI and by a real `memdiag serve`, with real BPF."""

from __future__ import annotations

from pathlib import Path

from containers import Image, container, leftovers, ns_pid, processes_in, shared_libraries
from kit import build

MiB = 1 << 20


def test_the_kit_runs_a_workload_in_its_own_memory_cgroup_with_its_limit(podman_container):
    c = podman_container("leak", "256", memory="96m", memory_swap="96m", init=True)
    assert c.cgroup == f"/libpod_parent/libpod-{c.id}" and len(c.id) == 64
    limit = Path("/sys/fs/cgroup/memory", c.cgroup.lstrip("/"), "memory.limit_in_bytes").read_text()
    assert int(limit) == 96 * MiB
    pids = processes_in(c.cgroup)
    assert c.pid in pids and len(pids) == 2  # catatonit (--init) and the workload
    leak = next(p for p in pids if Path(f"/proc/{p}/comm").read_text().strip() == "leak")
    assert ns_pid(leak) > 1 and ns_pid(c.pid) == 1 and f"ready {ns_pid(leak)}" in c.logs()
    assert Path(f"/proc/{leak}/root/app/leak").read_bytes() == build("leak").read_bytes()
    assert c.inspect("{{.Name}}") == c.name and c.inspect("{{.HostConfig.Memory}}") == str(96 * MiB)


def test_the_kit_removes_its_image_and_containers(root_required):
    with Image({"leak": build("leak")}) as image:
        assert image.build_seconds < 30
        libs = shared_libraries(build("leak"))
        assert any("libc.so" in lib for lib in libs) and any("ld-linux" in lib for lib in libs)
        with container(image, "leak", "64") as c:
            assert c.start_seconds < 30
            assert c.name in leftovers()[0]
            try:
                with container(image, "leak", "64", name=f"{c.name}-x", ready="never printed", timeout=1):
                    pass
                raise AssertionError("a container that never gets ready must raise")
            except RuntimeError as e:
                assert "did not start" in str(e)
            assert f"{c.name}-x" not in leftovers()[0]  # removed by the failed start itself
        assert c.name not in leftovers()[0]
    names, tags = leftovers()
    assert c.name not in names and image.tag.split(":")[0] not in tags
