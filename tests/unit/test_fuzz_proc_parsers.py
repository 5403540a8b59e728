"""Property-based fuzzing (hypothesis) of the readers of text and bytes a target can shape: /proc
and cgroup files, /dev/kmsg records, smaps, container paths and a Go program's build info. Each is
fed this host's real file mutated (lines dropped, repeated, cut, numbers replaced by huge, negative
or non-numbers, unicode and NULs put in) and arbitrary text. For every input: the reader returns
(a model, None or an empty result) or raises only the error it documents, within a time bound,
never a traceback out of an unexpected type.

A pid's status, stat and cmdline carry the target's own name and argv; a container can name its
cgroups; the kernel log quotes a victim's comm; a Go binary's build info is the target's bytes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memdiag.probes.mapping import parse_maps
from memdiag.system.cgroup import parse_mountinfo, parse_proc_cgroup
from memdiag.system.container import parse_container_path, parse_pod_path
from memdiag.system.jvm import parse_smaps
from memdiag.system.kmsg import parse_kmsg_line, parse_kmsg_records
from memdiag.system.meminfo import parse_meminfo
from memdiag.system.process import parse_process
from memdiag.system.psi import parse_psi
from memdiag.system.runtime import maps_node, parse_go_buildinfo, parse_jdk_release
from memdiag.system.slab import parse_slabinfo
from memdiag.system.swaps import parse_swaps
from memdiag.system.v8memory import parse_smaps as parse_v8_smaps
from memdiag.system.v8memory import parse_v8_heap_ranges
from memdiag.system.vmstat import parse_vmstat

EXAMPLES = 150  # per reader: 17 readers, ~10 s in all here
PER_INPUT_S = 1.0  # a reader taking a second on a few KiB of text is a hang in the making
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # timed below against PER_INPUT_S, with a message that names the input
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _real(path: str, fallback: str) -> str:
    try:
        return Path(path).read_text()[:4000]
    except OSError:
        return fallback


SELF = "/proc/self"
SAMPLES = {
    "meminfo": _real("/proc/meminfo", "MemTotal: 100 kB\n"),
    "vmstat": _real("/proc/vmstat", "pgfault 1\n"),
    "psi": _real("/proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
    "status": _real(f"{SELF}/status", "Name:\tx\nVmRSS:\t1 kB\n"),
    "stat": _real(f"{SELF}/stat", "1 (x) S 0 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0\n"),
    "smaps_rollup": _real(f"{SELF}/smaps_rollup", "Rss: 1 kB\n"),
    "maps": _real(f"{SELF}/maps", "00400000-00401000 r-xp 00000000 08:01 1 /bin/x\n"),
    "smaps": _real(f"{SELF}/smaps", "00400000-00401000 r-xp 00000000 08:01 1 /bin/x\nRss: 4 kB\n"),
    "mountinfo": _real(f"{SELF}/mountinfo", "1 0 0:1 / / rw - ext4 /dev/x rw\n"),
    "cgroup": _real(f"{SELF}/cgroup", "0::/\n"),
    "slabinfo": _real("/proc/slabinfo", "slabinfo - version: 2.1\n"),
    "swaps": _real("/proc/swaps", "Filename Type Size Used Priority\n"),
    "kmsg": "6,1,100,-;oom-kill:constraint=CONSTRAINT_MEMCG,task=x,pid=1,uid=0\n"
    "3,2,200,-;Memory cgroup out of memory: Killed process 1 (x) total-vm:1kB, anon-rss:1kB\n",
    "release": 'JAVA_VERSION="17.0.15"\nIMPLEMENTOR="Debian"\n',
    "path": "/kubepods/burstable/pod1234abcd-0000-0000-0000-000000000000/cri-containerd-" + "a" * 64,
}

_ODD = st.sampled_from(
    ["18446744073709551616", "-1", "9" * 400, "nan", "0x", "\x00", "\u202e", "(", ")", ":", "\t", " kB", "=", "-"]
)


@st.composite
def mutated(draw, name: str) -> str:
    """The real file of `name`, its lines dropped, repeated, cut or salted with odd tokens."""
    lines = SAMPLES[name].splitlines()
    out = []
    for line in lines[:60]:
        op = draw(st.integers(0, 9))
        if op == 0:
            continue
        if op == 1:
            line = line[: draw(st.integers(0, len(line)))]
        elif op == 2:
            words = line.split()
            if words:
                words[draw(st.integers(0, len(words) - 1))] = draw(_ODD)
            line = draw(st.sampled_from([" ", "\t", ":"])).join(words)
        elif op == 3:
            out.extend([line] * draw(st.integers(2, 5)))
        out.append(line)
    if draw(st.booleans()):
        out.append(draw(st.text(max_size=200)))
    return "\n".join(out)


def texts(name: str):
    return st.one_of(mutated(name), st.text(max_size=2000))


def _timed(fn, *args):
    start = time.monotonic()
    out = fn(*args)
    spent = time.monotonic() - start
    assert spent < PER_INPUT_S, f"{fn.__name__} took {spent:.2f} s on {args!r:.200}"
    return out


READERS = {
    "meminfo": parse_meminfo,
    "vmstat": parse_vmstat,
    "psi": parse_psi,
    "maps": parse_maps,
    "smaps": parse_smaps,
    "mountinfo": parse_mountinfo,
    "cgroup": parse_proc_cgroup,
    "slabinfo": parse_slabinfo,
    "swaps": parse_swaps,
    "release": parse_jdk_release,
}


@pytest.mark.parametrize("name", sorted(READERS))
def test_a_reader_of_text_takes_any_text(name):
    reader = READERS[name]

    @FUZZ
    @given(texts(name))
    def run(text):
        _timed(reader, text)

    run()


@FUZZ
@given(texts("smaps"), texts("maps"))
def test_the_v8_readers_take_any_text(smaps, maps):
    _timed(parse_v8_smaps, smaps)
    _timed(parse_v8_heap_ranges, maps)
    _timed(maps_node, maps)


@FUZZ
@given(texts("status"), st.one_of(st.none(), texts("stat")), st.one_of(st.none(), texts("smaps_rollup")),
       st.one_of(st.none(), st.text(max_size=500)))  # fmt: skip
def test_a_process_is_read_from_any_status_stat_and_cmdline(status, stat, rollup, cmdline):
    got = _timed(parse_process, 1, status, stat, rollup, cmdline)
    assert got.pid == 1


@FUZZ
@given(st.lists(st.one_of(mutated("kmsg"), st.text(max_size=300)), max_size=40))
def test_kernel_log_records_of_any_shape(lines):
    records = [r for r in (_timed(parse_kmsg_line, line) for line in lines) if r is not None]
    for kill in _timed(parse_kmsg_records, records):
        assert kill.victim_comm is None or isinstance(kill.victim_comm, str)


@FUZZ
@given(st.one_of(mutated("path"), st.text(max_size=400)))
def test_a_cgroup_path_a_container_may_name(path):
    _timed(parse_container_path, path)
    _timed(parse_pod_path, path)


GO_MAGIC = b"\xff Go buildinf:"


@FUZZ
@given(st.binary(max_size=64), st.integers(0, 255), st.integers(0, 255), st.binary(max_size=600))
def test_a_go_build_info_of_any_bytes(pad, ptr_size, flags, tail):
    """The blob a Go binary carries, from the target's file: the magic at an aligned offset, then
    lengths and pointers that may lie (a varint of 2^63, a string past the end, a pointer anywhere)."""
    blob = b"\0" * (len(pad) // 16 * 16) + GO_MAGIC + bytes([ptr_size, flags]) + tail

    def read(addr: int, n: int) -> bytes | None:
        assert n <= 1 << 20, f"asked to read {n} bytes at {addr:#x}"
        return tail[:n] if addr < len(tail) else None

    got = _timed(parse_go_buildinfo, blob, read)
    assert got is None or isinstance(got.version, str)
