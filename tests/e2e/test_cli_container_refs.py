"""`memdiag --container` through the installed command on this host's real cgroup tree: every bad
reference is one line and exit 2, and a container found by its id prefix is diagnosed as its
cgroup, the report in its terms. The cgroups are real memory cgroups named as Docker's systemd
driver names a container (`docker-<64 hex>.scope`), with real workloads in them; real podman
containers are tests/e2e/test_containers*.py's."""

import json
import uuid
from pathlib import Path

MiB = 1 << 20


def _cid() -> str:
    return uuid.uuid4().hex + uuid.uuid4().hex


def _one_line_exit_2(r, expected: str) -> None:
    assert r.returncode == 2, r.stderr
    assert r.stdout == "" and r.stderr == expected + "\n"


def test_bad_references_are_one_line_and_exit_2(memdiag, root_required, memcg):
    parent = memcg(None)  # stands for system.slice
    a, b = _cid(), _cid()
    b = a[:6] + b[6:]  # two containers whose ids share 6 digits
    memcg(None, name=f"{parent.name}/docker-{a}.scope")
    memcg(None, name=f"{parent.name}/docker-{b}.scope")
    r = memdiag("--container", a[:6], "--duration", "1")
    listed = ", ".join(sorted([a[:12], b[:12]]))  # in path order: the same parent, so by id
    _one_line_exit_2(r, f"memdiag: --container {a[:6]}: ambiguous, matches 2 containers: {listed}")
    r = memdiag("--container", a[:3], "--duration", "1")
    _one_line_exit_2(r, f"memdiag: --container {a[:3]}: an id prefix needs at least 4 hex digits")
    r = memdiag("--container", "a b;reboot", "--duration", "1")
    _one_line_exit_2(
        r, "memdiag: --container 'a b;reboot': not a container id or name (letters, digits, '_', '.', '-')"
    )
    r = memdiag("--container", "memdiag-no-such-container", "--duration", "1")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.splitlines()) == 1
    assert r.stderr.startswith("memdiag: --container memdiag-no-such-container: no such running container")
    assert a[:12] in r.stderr and b[:12] in r.stderr  # what is running is listed
    r = memdiag("--container", a, "--pid", "1")
    _one_line_exit_2(r, "memdiag: argument -p/--pid: not allowed with argument --container (see --help)")


def test_a_container_by_id_prefix_is_its_largest_process(memdiag, root_required, memcg, workload, tmp_path):
    parent = memcg(None)
    cid = _cid()
    cg = memcg(256 * MiB, name=f"{parent.name}/docker-{cid}.scope")
    w = workload("leak", "2048", "200", cgroup=cg)
    out = tmp_path / "out"
    r = memdiag("--container", cid[:10], "--duration", "4", "--output", str(out))
    assert r.returncode == 0, r.stderr
    rep = json.loads((out / "report.json").read_text())
    c = rep["target"]["container"]
    assert rep["target"]["kind"] == "pid" and rep["target"]["pid"] == w.pid and rep["target"]["cgroup"] == cg.path
    assert (c["id"], c["runtime"], c["cgroup"], c["limit_bytes"], c["host_pid"]) == (
        cid,
        "docker",
        cg.path,
        256 * MiB,
        w.pid,
    )
    md = Path(out / "report.md").read_text().splitlines()
    assert md[0] == f"# memdiag: {rep['verdict']['kind']} — PID {w.pid} (leak) in container {cid[:12]}"
    assert f"- Container: id `{cid[:12]}` (full `{cid}`), docker" in md
    assert f"- Container memory: limit 256 MiB, OOM kills 0 (the cgroup's counter), cgroup `{cg.path}`" in md
    assert f"- Main process: PID {w.pid} on the host" in md
    assert any(line.startswith(f"| PID {w.pid} (leak) |") for line in md)  # no pid namespace: one pid
