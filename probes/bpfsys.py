"""The bpf(2) and perf_event_open(2) calls memdiag needs to run programs it compiled earlier:
create maps, load programs, attach them to tracepoints, raw tracepoints, uprobes, kprobes and
perf events, and read maps. Plain system calls through ctypes (their argument layouts are
kernel ABI and only ever grow); libbpf (libbpf1, a dependency of the distro's bcc) for perf
buffers. None of this links LLVM, which is what keeps the diagnosing process small: bcc's
Python module alone maps about 64 MiB of LLVM before compiling anything (measured on 6.18)."""

from __future__ import annotations

import ctypes as ct
import errno
import fcntl
import os
from functools import cache
from pathlib import Path

from memdiag.system import arch
from memdiag.system.signals import INTERRUPTION

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


MAP_CREATE, MAP_LOOKUP_ELEM, MAP_UPDATE_ELEM, MAP_DELETE_ELEM, MAP_GET_NEXT_KEY, PROG_LOAD = 0, 1, 2, 3, 4, 5
RAW_TRACEPOINT_OPEN = 17
MAP_LOOKUP_BATCH = 24  # Linux 5.6
LINK_CREATE = 28  # Linux 5.7
TRACE_UPROBE_MULTI = 48  # enum bpf_attach_type: a uprobe_multi link (Linux 6.6)
F_UPROBE_MULTI_RETURN = 1  # its flag for return probes
ENABLE_STATS = 32  # Linux 5.8
STATS_RUN_TIME = 0

PROG_KPROBE, PROG_TRACEPOINT, PROG_PERF_EVENT, PROG_RAW_TRACEPOINT = 2, 5, 7, 17
MAP_PERCPU_HASH, MAP_PERCPU_ARRAY, MAP_LRU_PERCPU_HASH = 5, 6, 10
MAP_ARRAY_TYPES = {2, 6}  # ARRAY, PERCPU_ARRAY
MAP_PERF_EVENT_ARRAY = 4

PERF_TYPE_SOFTWARE, PERF_TYPE_TRACEPOINT = 1, 2
PERF_COUNT_SW_PAGE_FAULTS_MAJ = 6
_IOC_ENABLE, _IOC_SET_BPF = 0x2400, 0x40042408


class BpfError(OSError):
    """A bpf(2) or perf_event_open(2) call failed; the message says which and why."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


class Interrupted(BpfError):
    """A load the verifier gave up for a signal memdiag is stopping for (SIGINT, SIGTERM): not a
    refusal, and nothing to try again or another way."""


def _nr(name: str) -> int:
    nr = arch.syscall_number(name)
    if nr is None:
        raise BpfError(0, f"memdiag does not know the {name} system call number on {arch.MACHINE}")
    return nr


def _bpf(cmd: int, attr: ct.Structure, what: str) -> int:
    r = _libc.syscall(_nr("bpf"), cmd, ct.byref(attr), ct.sizeof(attr))
    if r < 0:
        err = ct.get_errno()
        raise BpfError(err, f"{what}: {os.strerror(err)}")
    return r


class _MapCreate(ct.Structure):
    _fields_ = [
        ("map_type", ct.c_uint32),
        ("key_size", ct.c_uint32),
        ("value_size", ct.c_uint32),
        ("max_entries", ct.c_uint32),
        ("map_flags", ct.c_uint32),
        ("inner_map_fd", ct.c_uint32),
        ("numa_node", ct.c_uint32),
        ("map_name", ct.c_char * 16),
        ("_rest", ct.c_uint8 * 80),
    ]


class _MapElem(ct.Structure):
    _fields_ = [
        ("map_fd", ct.c_uint32),
        ("_pad", ct.c_uint32),
        ("key", ct.c_uint64),
        ("value", ct.c_uint64),  # next_key for GET_NEXT_KEY
        ("flags", ct.c_uint64),
    ]


class _ProgLoad(ct.Structure):
    _fields_ = [
        ("prog_type", ct.c_uint32),
        ("insn_cnt", ct.c_uint32),
        ("insns", ct.c_uint64),
        ("license", ct.c_uint64),
        ("log_level", ct.c_uint32),
        ("log_size", ct.c_uint32),
        ("log_buf", ct.c_uint64),
        ("kern_version", ct.c_uint32),
        ("prog_flags", ct.c_uint32),
        ("prog_name", ct.c_char * 16),
        ("prog_ifindex", ct.c_uint32),
        ("expected_attach_type", ct.c_uint32),
        ("_rest", ct.c_uint8 * 56),
    ]


class _UprobeMultiLink(ct.Structure):
    """union bpf_attr's link_create with its uprobe_multi member (include/uapi/linux/bpf.h)."""

    _fields_ = [
        ("prog_fd", ct.c_uint32),
        ("target_fd", ct.c_uint32),
        ("attach_type", ct.c_uint32),
        ("flags", ct.c_uint32),
        ("path", ct.c_uint64),
        ("offsets", ct.c_uint64),
        ("ref_ctr_offsets", ct.c_uint64),
        ("cookies", ct.c_uint64),
        ("cnt", ct.c_uint32),
        ("multi_flags", ct.c_uint32),
        ("pid", ct.c_uint32),
        ("_rest", ct.c_uint8 * 36),
    ]


class _RawTracepoint(ct.Structure):
    _fields_ = [("name", ct.c_uint64), ("prog_fd", ct.c_uint32), ("_pad", ct.c_uint32)]


def map_create(map_type: int, name: str, key_size: int, value_size: int, max_entries: int, flags: int) -> int:
    attr = _MapCreate(map_type, key_size, value_size, max_entries, flags)
    attr.map_name = name.encode()[:15]
    try:
        return _bpf(MAP_CREATE, attr, f"creating map {name}")
    except BpfError:
        attr.map_name = b""  # kernels before 4.15 know no map names
        return _bpf(MAP_CREATE, attr, f"creating map {name}")


def _elem(cmd: int, fd: int, key, value, flags: int = 0) -> int:
    attr = _MapElem(fd, 0, ct.addressof(key) if key is not None else 0, ct.addressof(value), flags)
    r = _libc.syscall(_nr("bpf"), cmd, ct.byref(attr), ct.sizeof(attr))
    return 0 if r == 0 else ct.get_errno()


def lookup(fd: int, key, value) -> bool:
    return _elem(MAP_LOOKUP_ELEM, fd, key, value) == 0


def update(fd: int, key, value) -> None:
    err = _elem(MAP_UPDATE_ELEM, fd, key, value)
    if err:
        raise BpfError(err, f"updating a map element: {os.strerror(err)}")


def delete(fd: int, key) -> bool:
    attr = _MapElem(fd, 0, ct.addressof(key), 0, 0)
    return _libc.syscall(_nr("bpf"), MAP_DELETE_ELEM, ct.byref(attr), ct.sizeof(attr)) == 0


def next_key(fd: int, key, out) -> bool:
    """The key after key (the first one when key is None) into out; False at the end."""
    return _elem(MAP_GET_NEXT_KEY, fd, key, out) == 0


class _Batch(ct.Structure):
    _fields_ = [
        ("in_batch", ct.c_uint64),
        ("out_batch", ct.c_uint64),
        ("keys", ct.c_uint64),
        ("values", ct.c_uint64),
        ("count", ct.c_uint32),
        ("map_fd", ct.c_uint32),
        ("elem_flags", ct.c_uint64),
        ("flags", ct.c_uint64),
    ]


def lookup_batch(fd: int, key_size: int, value_size: int, max_entries: int) -> tuple[bytes, bytes, int] | None:
    """Every (key, value) of a hash map in a few calls: (keys, values, count), packed one after
    another; None where the kernel has no batch look-up (before 5.6). One element at a time
    costs two system calls; a reachability scan reads up to 262,144 of them with the target
    stopped."""
    # At most 4,096 elements a call (64 calls for a full memleak table): buffers for 65,536 were
    # 3 MiB, zeroed, and .raw copied each whole, at every look at memleak's table: the largest of
    # memdiag's transients, 4-5 MiB over its resident memory at each pricing of the scan (measured)
    count = max(1, min(max_entries, 4096))
    keys = ct.create_string_buffer(key_size * count)
    values = ct.create_string_buffer(value_size * count)
    token_in, token_out = ct.c_uint64(0), ct.c_uint64(0)
    out_k, out_v, total, first = bytearray(), bytearray(), 0, True
    while True:
        attr = _Batch(
            0 if first else ct.addressof(token_in), ct.addressof(token_out), ct.addressof(keys), ct.addressof(values),
            count, fd, 0, 0,
        )  # fmt: skip
        r = _libc.syscall(_nr("bpf"), MAP_LOOKUP_BATCH, ct.byref(attr), ct.sizeof(attr))
        err = ct.get_errno() if r < 0 else 0
        if r < 0 and err != errno.ENOENT:  # no batch look-up here (EINVAL), or the map changed
            return None
        n = attr.count
        out_k += ct.string_at(keys, n * key_size)  # the n elements only (.raw copies the whole buffer)
        out_v += ct.string_at(values, n * value_size)
        total += n
        if err == errno.ENOENT:  # no more elements
            return bytes(out_k), bytes(out_v), total
        token_in.value, first = token_out.value, False


def prog_load(prog_type: int, name: str, insns: bytes, license: str, kern_version: int, attach_type: int = 0) -> int:
    """attach_type: the program's expected_attach_type (TRACE_UPROBE_MULTI for a uprobe_multi link)."""
    buf = ct.create_string_buffer(insns, len(insns))
    lic = ct.create_string_buffer(license.encode())
    attr = _ProgLoad(prog_type, len(insns) // 8, ct.addressof(buf), ct.addressof(lic))
    attr.kern_version = kern_version
    attr.expected_attach_type = attach_type
    attr.prog_name = name.encode()[:15]
    # The verifier stops for any signal pending on the thread (EAGAIN) and its work is lost: a
    # signal memdiag stops for ends the load; another (a child's end, a window resized) loads again.
    for _attempt in range(_VERIFIER_RETRIES):
        try:
            return _bpf(PROG_LOAD, attr, f"loading {name}")
        except BpfError as e:
            if e.errno not in (errno.EAGAIN, errno.EINTR):
                break
            if INTERRUPTION.caught:
                raise Interrupted(errno.EINTR, f"loading {name}: stopped by {INTERRUPTION.signal_name}") from None
    # Refused: load again with the verifier's log, which is what says why.
    log = ct.create_string_buffer(1 << 20)
    attr.log_level, attr.log_size, attr.log_buf = 1, len(log), ct.addressof(log)
    try:
        return _bpf(PROG_LOAD, attr, f"loading {name}")
    except BpfError as e:
        tail = log.value.decode(errors="replace").strip().splitlines()[-3:]
        raise BpfError(e.errno, f"{e.strerror}; verifier: {' / '.join(tail)}") from None


_VERIFIER_RETRIES = 3


def uprobe_multi_link(prog_fd: int, path: bytes, offsets: list[int], ret: bool, pid: int) -> int:
    """One link attaching prog at every file offset of path (return probes when ret), for one
    process (pid > 0) or all: attached together, and detached together after one grace period."""
    cpath = ct.create_string_buffer(path)
    offs = (ct.c_uint64 * len(offsets))(*offsets)
    attr = _UprobeMultiLink(prog_fd, 0, TRACE_UPROBE_MULTI, 0, ct.addressof(cpath), ct.addressof(offs))
    attr.cnt = len(offsets)
    attr.multi_flags = F_UPROBE_MULTI_RETURN if ret else 0
    attr.pid = max(pid, 0)
    return _bpf(LINK_CREATE, attr, f"attaching {len(offsets)} uprobes to {path.decode(errors='replace')} in one link")


def raw_tracepoint_open(name: str, prog_fd: int) -> int:
    cname = ct.create_string_buffer(name.encode())
    attr = _RawTracepoint(ct.addressof(cname), prog_fd)
    return _bpf(RAW_TRACEPOINT_OPEN, attr, f"attaching raw tracepoint {name}")


class _EnableStats(ct.Structure):
    _fields_ = [("type", ct.c_uint32)]


def enable_stats() -> int:
    """BPF run-time statistics on for as long as the returned fd is open. The kernel counts the
    holders, so two diagnoses (or bpftool) never turn it off under each other, as writing the
    kernel.bpf_stats_enabled sysctl back would."""
    return _bpf(ENABLE_STATS, _EnableStats(STATS_RUN_TIME), "enabling BPF run-time statistics")


class _PerfAttr(ct.Structure):
    _fields_ = [
        ("type", ct.c_uint32),
        ("size", ct.c_uint32),
        ("config", ct.c_uint64),
        ("sample_period", ct.c_uint64),
        ("sample_type", ct.c_uint64),
        ("read_format", ct.c_uint64),
        ("flags", ct.c_uint64),
        ("wakeup_events", ct.c_uint32),
        ("bp_type", ct.c_uint32),
        ("config1", ct.c_uint64),
        ("config2", ct.c_uint64),
        ("_rest", ct.c_uint8 * 56),
    ]


def perf_event_open(
    type_: int, config: int, pid: int = -1, cpu: int = 0, config1: int = 0, config2: int = 0, period: int = 1
) -> int:
    attr = _PerfAttr(type=type_, size=ct.sizeof(_PerfAttr), config=config, sample_period=period)
    attr.wakeup_events, attr.config1, attr.config2 = 1, config1, config2
    fd = _libc.syscall(_nr("perf_event_open"), ct.byref(attr), pid, cpu, -1, 8)  # 8: PERF_FLAG_FD_CLOEXEC
    if fd < 0:
        err = ct.get_errno()
        raise BpfError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


def set_bpf(perf_fd: int, prog_fd: int) -> None:
    fcntl.ioctl(perf_fd, _IOC_SET_BPF, prog_fd)
    fcntl.ioctl(perf_fd, _IOC_ENABLE, 0)


@cache
def pmu(name: str) -> tuple[int, int]:
    """(PMU type, bit of config that makes a return probe) of the uprobe or kprobe PMU (4.17+)."""
    base = Path("/sys/bus/event_source/devices", name)
    try:
        type_ = int((base / "type").read_text())
    except (OSError, ValueError):
        raise BpfError(0, f"no {name} PMU (/sys/bus/event_source/devices/{name}; kernel 4.17+)") from None
    try:
        bit = int((base / "format/retprobe").read_text().strip().split(":")[1])
    except (OSError, ValueError, IndexError):
        bit = 0
    return type_, bit


def possible_cpus() -> list[int]:
    return _cpu_list(Path("/sys/devices/system/cpu/possible").read_text())


def online_cpus() -> list[int]:
    return _cpu_list(Path("/sys/devices/system/cpu/online").read_text())


def _cpu_list(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


# Perf buffers: libbpf's reader (ring per CPU, lost-record accounting) rather than our own.
_SAMPLE_CB = ct.CFUNCTYPE(None, ct.c_void_p, ct.c_int, ct.c_void_p, ct.c_uint32)
_LOST_CB = ct.CFUNCTYPE(None, ct.c_void_p, ct.c_int, ct.c_uint64)


@cache
def _libbpf() -> ct.CDLL:
    lib = ct.CDLL("libbpf.so.1", use_errno=True)
    lib.perf_buffer__new.restype = ct.c_void_p
    lib.perf_buffer__new.argtypes = [ct.c_int, ct.c_size_t, _SAMPLE_CB, _LOST_CB, ct.c_void_p, ct.c_void_p]
    lib.perf_buffer__poll.argtypes = [ct.c_void_p, ct.c_int]
    lib.perf_buffer__free.argtypes = [ct.c_void_p]
    return lib


class PerfBuffer:
    """Per-CPU rings behind a BPF_PERF_OUTPUT map; callback(cpu, data_address, size)."""

    def __init__(self, map_fd: int, callback, lost_callback=None, pages: int = 8):
        self._sample = _SAMPLE_CB(lambda _ctx, cpu, data, size: callback(cpu, data, size))
        self._lost = _LOST_CB(lambda _ctx, cpu, n: lost_callback(n) if lost_callback else None)
        lib = _libbpf()
        self._pb = lib.perf_buffer__new(map_fd, pages, self._sample, self._lost, None, None)
        if not self._pb:
            err = ct.get_errno()
            raise BpfError(err, f"opening a perf buffer: {os.strerror(err)}")

    def poll(self, timeout_ms: int) -> None:
        if self._pb:
            _libbpf().perf_buffer__poll(self._pb, timeout_ms)

    def close(self) -> None:
        if self._pb:
            _libbpf().perf_buffer__free(self._pb)
            self._pb = None
