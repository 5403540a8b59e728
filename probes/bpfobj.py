"""A compiled probe brought to life in this process: its maps created, its programs loaded and
attached, its maps read as ctypes values. The compiled form (bytecode, map specs, key and value
types) comes from probes.compiler; nothing here needs LLVM. The interface is the part of bcc's
BPF object memdiag's probes use (tables by name, attach_uprobe and friends, perf buffers, ksym),
so a probe reads the same whichever way its program was built."""

from __future__ import annotations

import array
import bisect
import ctypes as ct
import os
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from memdiag.system import identity
from memdiag.system.signals import INTERRUPTION, interrupted

from . import bpfsys as sys_
from .elf import elf_info
from .kernel import tracefs_root

_TYPES = {
    "_Bool": ct.c_bool,
    "char": ct.c_char,
    "unsigned char": ct.c_ubyte,
    "short": ct.c_short,
    "unsigned short": ct.c_ushort,
    "int": ct.c_int,
    "unsigned int": ct.c_uint,
    "long": ct.c_long,
    "unsigned long": ct.c_ulong,
    "long long": ct.c_longlong,
    "unsigned long long": ct.c_ulonglong,
    "float": ct.c_float,
    "double": ct.c_double,
    "__int128": ct.c_int64 * 2,
    "unsigned __int128": ct.c_uint64 * 2,
    "signed char": ct.c_byte,
    "void *": ct.c_void_p,
    "char *": ct.c_char_p,
}


def ctype_of(desc) -> type:
    """A ctypes type from the compiler's JSON type description (a C type name, or
    [name, [fields], "struct"|"union"|"struct_packed"]; a field is [name, type], [name, type, [n]]
    for an array or [name, type, bits] for a bit field)."""
    if isinstance(desc, str):
        return _TYPES[desc]
    fields: list[tuple] = []
    anonymous: list[str] = []
    for f in desc[1]:
        if len(f) == 2:
            fields.append((f[0], ctype_of(f[1])))
        elif isinstance(f[2], list):
            fields.append((f[0], ctype_of(f[1]) * f[2][0]))
        elif isinstance(f[2], int):
            fields.append((f[0], ctype_of(f[1]), f[2]))
        else:  # a nested struct or union
            name = f[0] or f"__anon{len(anonymous)}"
            if not f[0]:
                anonymous.append(name)
            fields.append((name, ctype_of(f)))
    kind = desc[2] if len(desc) > 2 else "struct"
    base = ct.Union if kind == "union" else ct.Structure
    attrs: dict = {"_fields_": fields, "_anonymous_": anonymous}
    if kind == "struct_packed":
        attrs["_pack_"] = 1
    return type(str(desc[0]) or "anon", (base,), attrs)


class Table:
    """One map: items(), [key], [key] = value, walk(stack_id) for stack maps, perf buffers."""

    def __init__(self, program: Program, spec: dict, fd: int):
        self.program, self.name, self.map_fd = program, spec["name"], fd
        self.map_type, self.max_entries = spec["type"], spec["max_entries"]
        self.Key = ctype_of(spec["key_desc"])
        leaf = ctype_of(spec["leaf_desc"])
        self.Leaf = leaf
        self._percpu = self.map_type in (sys_.MAP_PERCPU_HASH, sys_.MAP_PERCPU_ARRAY, sys_.MAP_LRU_PERCPU_HASH)
        if self._percpu:  # the kernel hands out one 8-byte-aligned value per possible CPU
            size = (ct.sizeof(leaf) + 7) // 8 * 8
            self._value_type = ct.c_ubyte * (size * len(sys_.possible_cpus()))
        else:
            self._value_type = leaf
        self._perf: sys_.PerfBuffer | None = None

    def _key(self, key):
        return self.Key(key) if isinstance(key, int) else key

    def _value(self, raw):
        if not self._percpu:
            return raw
        size = len(raw) // len(sys_.possible_cpus())
        return [self.Leaf.from_buffer_copy(bytes(raw)[i : i + ct.sizeof(self.Leaf)]) for i in range(0, len(raw), size)]

    def __getitem__(self, key):
        value = self._value_type()
        if not sys_.lookup(self.map_fd, self._key(key), value):
            raise KeyError(key)
        return self._value(value)

    def __setitem__(self, key, value) -> None:
        sys_.update(self.map_fd, self._key(key), value)

    def __delitem__(self, key) -> None:
        if not sys_.delete(self.map_fd, self._key(key)):
            raise KeyError(key)

    def keys(self):
        if self.map_type in sys_.MAP_ARRAY_TYPES:
            # arrays have every index; no need to ask the kernel one key at a time
            yield from (self.Key(i) for i in range(self.max_entries))
            return
        key, nxt = None, self.Key()
        while sys_.next_key(self.map_fd, key, nxt):
            key, nxt = nxt, self.Key()
            yield key

    __iter__ = keys

    def items(self):
        for key in list(self.keys()):
            try:
                yield key, self[key]
            except KeyError:  # removed since the keys were listed
                continue

    def values(self):
        return [v for _, v in self.items()]

    def dump(self) -> tuple[bytes, bytes, int]:
        """Every key and value, raw and packed: (keys, values, count). One batch look-up where
        the kernel offers it, else one element at a time."""
        got = None
        if not self._percpu and self.map_type not in sys_.MAP_ARRAY_TYPES:
            got = sys_.lookup_batch(self.map_fd, ct.sizeof(self.Key), ct.sizeof(self.Leaf), self.max_entries)
        if got is not None:
            return got
        pairs = list(self.items())
        return b"".join(bytes(k) for k, _ in pairs), b"".join(bytes(v) for _, v in pairs), len(pairs)

    def clear(self) -> None:
        for key in list(self.keys()):
            sys_.delete(self.map_fd, key)

    def walk(self, stack_id: int):
        """The addresses of one stack of a stack-trace map, innermost first."""
        for address in self[stack_id].ip:
            if not address:
                return
            yield address

    def event(self, data):
        return ct.cast(data, ct.POINTER(self.Leaf)).contents

    def open_perf_buffer(self, callback, page_cnt: int = 8, lost_cb=None) -> None:
        self._perf = sys_.PerfBuffer(self.map_fd, callback, lost_cb, page_cnt)
        self.program.perf_buffers.append(self._perf)


class Function:
    def __init__(self, name: str, fd: int):
        self.name, self.fd = name, fd


def _not_attached() -> sys_.Interrupted:
    return sys_.Interrupted(0, f"not attached: {INTERRUPTION.signal_name} came while the probes were attached")


@dataclass(frozen=True)
class Uprobe:
    """A uprobe asked for inside Program.uprobe_batch(), attached when the batch ends."""

    fn_name: str
    path: bytes
    offset: int  # in the file
    ret: bool
    pid: int
    tag: object = None  # the caller's, handed back with a failure


# uprobe_multi links (6.6+): None until one was tried, then whether this kernel has them
_MULTI: list[bool | None] = [None]


def multi_links() -> bool:
    """Whether this kernel attached a uprobe_multi link for memdiag (False: not yet, or none here)."""
    return _MULTI[0] is True


class Program:
    """The programs and maps of one compiled probe; cleanup() releases everything."""

    def __init__(self, compiled: dict):
        self.compiled = compiled
        self.funcs: dict[str, Function] = {}
        self.tables: dict[str, Table] = {}
        self.perf_buffers: list[sys_.PerfBuffer] = []
        self._attachments: list[int] = []  # perf-event, raw-tracepoint and link fds that hold attachments
        self._batch: list[Uprobe] | None = None  # uprobes asked for inside uprobe_batch()
        self.links = 0  # uprobe_multi links among the attachments
        self._fd_of: dict[int, int] = {}  # the compiler's map fd -> ours
        try:
            for m in compiled["maps"]:
                entries = m["max_entries"]
                if m["type"] == sys_.MAP_PERF_EVENT_ARRAY:
                    entries = len(sys_.possible_cpus())
                fd = sys_.map_create(m["type"], m["name"], m["key_size"], m["leaf_size"], entries, m["flags"])
                self._fd_of[m["fd"]] = fd
                self.tables[m["name"]] = Table(self, m, fd)
            self._autoload()
        except BaseException:
            self.cleanup()
            raise

    def __getitem__(self, name) -> Table:
        if isinstance(name, bytes):
            name = name.decode()
        return self.tables[name]

    # --- programs -------------------------------------------------------------------------
    def _insns(self, name: str) -> bytes:
        code = bytearray(bytes.fromhex(self.compiled["functions"][name]))
        i = 0
        while i + 16 <= len(code):
            # ld_imm64 with src_reg 1 (BPF_PSEUDO_MAP_FD) or 2 (BPF_PSEUDO_MAP_VALUE): imm is a map fd
            if code[i] == 0x18 and (code[i + 1] >> 4) in (1, 2):
                (old,) = struct.unpack_from("<i", code, i + 4)
                if old not in self._fd_of:
                    raise sys_.BpfError(0, f"{name}: bytecode refers to a map the compiler did not describe")
                struct.pack_into("<i", code, i + 4, self._fd_of[old])
                i += 16
            else:
                i += 8
        return bytes(code)

    def load_func(self, name: str, prog_type: int, attach_type: int = 0) -> Function:
        """The program loaded once per type and expected attach type (a uprobe_multi link takes a
        program loaded for it; a perf event refuses that one)."""
        key = f"{name}/{prog_type}/{attach_type}"
        if key not in self.funcs:
            if name not in self.compiled["functions"]:
                raise sys_.BpfError(0, f"no function {name} in {self.compiled['name']}.c")
            fd = sys_.prog_load(
                prog_type, name, self._insns(name), self.compiled["license"], self.compiled["kern_version"], attach_type
            )
            self.funcs[key] = Function(name, fd)
        return self.funcs[key]

    def _autoload(self) -> None:
        # bcc's naming: TRACEPOINT_PROBE(cat, ev) is tracepoint__cat__ev, RAW_TRACEPOINT_PROBE(ev) is
        # raw_tracepoint__ev; both are attached as soon as the program is loaded.
        for name in self.compiled["functions"]:
            if name.startswith("tracepoint__"):
                category, _, event = name[len("tracepoint__") :].partition("__")
                self.attach_tracepoint(f"{category}:{event}", name)
            elif name.startswith("raw_tracepoint__"):
                fn = self.load_func(name, sys_.PROG_RAW_TRACEPOINT)
                self._attachments.append(sys_.raw_tracepoint_open(name[len("raw_tracepoint__") :], fn.fd))

    def attach_tracepoint(self, tp: str, fn_name: str) -> None:
        category, _, event = tp.partition(":")
        fn = self.load_func(fn_name, sys_.PROG_TRACEPOINT)
        tracefs = tracefs_root() or Path("/sys/kernel/tracing")
        try:
            tp_id = int((tracefs / "events" / category / event / "id").read_text())
        except (OSError, ValueError):
            raise sys_.BpfError(0, f"no tracepoint {tp} under {tracefs}/events") from None
        self._perf_attach(fn, sys_.PERF_TYPE_TRACEPOINT, tp_id)

    def _perf_attach(self, fn: Function, type_: int, config: int, pid: int = -1, cpu: int | None = None, **kw) -> None:
        """A perf event running fn: for one process (pid), or on cpu (every process: cpu 0 is
        enough for tracepoints and probes, which fire on whatever CPU the event happens)."""
        fd = sys_.perf_event_open(type_, config, pid=pid, cpu=(0 if pid == -1 else -1) if cpu is None else cpu, **kw)
        try:
            _same_process(pid)
            sys_.set_bpf(fd, fn.fd)
        except OSError:
            os.close(fd)
            raise
        self._attachments.append(fd)

    def _probe(self, pmu: str, fn_name: str, target: bytes, offset: int, ret: bool, pid: int) -> None:
        if not isinstance(target, bytes):  # checked before the PMU: a kernel without it must fail the same way
            raise TypeError(f"{pmu} target must be bytes, not {type(target).__name__} ({target!r})")
        type_, ret_bit = sys_.pmu(pmu)
        fn = self.load_func(fn_name, sys_.PROG_KPROBE)
        path = ct.create_string_buffer(target)
        config = (1 << ret_bit) if ret else 0
        self._perf_attach(fn, type_, config, pid=pid, config1=ct.addressof(path), config2=offset)

    def attach_uprobe(
        self,
        name: bytes,
        fn_name: bytes,
        sym: bytes = b"",
        sym_off: int = 0,
        addr: int | None = None,
        pid: int = -1,
        tag=None,
    ) -> None:
        """fn_name on entry to sym+sym_off (or the virtual address addr) of the ELF file name;
        inside uprobe_batch(), when the batch ends."""
        self._uprobe(Uprobe(fn_name.decode(), name, _file_offset(name, sym, sym_off, addr), False, pid, tag))

    def attach_uretprobe(
        self, name: bytes, fn_name: bytes, sym: bytes = b"", addr: int | None = None, pid: int = -1, tag=None
    ) -> None:
        self._uprobe(Uprobe(fn_name.decode(), name, _file_offset(name, sym, 0, addr), True, pid, tag))

    def _uprobe(self, u: Uprobe) -> None:
        if not isinstance(u.path, bytes):
            raise TypeError(f"uprobe target must be bytes, not {type(u.path).__name__} ({u.path!r})")
        if self._batch is not None:
            self._batch.append(u)
        else:
            self._probe("uprobe", u.fn_name, u.path, u.offset, u.ret, u.pid)

    @contextmanager
    def uprobe_batch(self):
        """Uprobes asked for inside are attached as the block ends, as uprobe_multi links where the
        kernel has them (6.6+): one link per program, file, direction and process, attached at
        once and detached after one grace period for all its probes, where each perf-event uprobe
        waits for one of its own (~100 ms here: 22 of memleak's took 2.3 s). Elsewhere, or where a
        link is refused, each probe its own perf event. Yields a list that receives, after the
        block, (tag, error) for each probe that could not be attached."""
        self._batch, failures = [], []
        try:
            yield failures
        finally:
            batch, self._batch = self._batch, None
        failures.extend(self._commit(batch))

    def _commit(self, batch: list[Uprobe]) -> list[tuple[object, OSError]]:
        groups: dict[tuple, list[Uprobe]] = {}
        for u in batch:
            groups.setdefault((u.fn_name, u.path, u.ret, u.pid), []).append(u)
        failures: list[tuple[object, OSError]] = []
        for (fn_name, path, ret, pid), probes in groups.items():
            if interrupted():  # each group loads and verifies a program: a signal stops the attaching
                failures.extend((u.tag, _not_attached()) for u in probes)
                continue
            try:
                if _MULTI[0] is not False and self._link(fn_name, path, ret, pid, probes):
                    continue
            except (identity.TargetChanged, sys_.Interrupted) as e:  # none of them is attached
                failures.extend((u.tag, e) for u in probes)
                continue
            refused = len(failures)
            for u in probes:  # one by one: a refused probe fails alone
                try:
                    if interrupted():
                        raise _not_attached()
                    self._probe("uprobe", u.fn_name, u.path, u.offset, u.ret, u.pid)
                except OSError as e:
                    failures.append((u.tag, e))
            if _MULTI[0] is None and len(failures) == refused:
                _MULTI[0] = False  # every probe attached alone where their link was refused: no links here
        return failures

    def _link(self, fn_name: str, path: bytes, ret: bool, pid: int, probes: list[Uprobe]) -> bool:
        """One uprobe_multi link for probes; False where the kernel refuses it (then each probe is
        attached alone: this kernel has no such links when that works and the link did not)."""
        offsets = list(dict.fromkeys(u.offset for u in probes))
        try:
            fn = self.load_func(fn_name, sys_.PROG_KPROBE, sys_.TRACE_UPROBE_MULTI)
            fd = sys_.uprobe_multi_link(fn.fd, path, offsets, ret, pid)
        except sys_.Interrupted:
            raise  # not a refusal of links: nothing is attached one by one instead
        except OSError:
            return False
        try:
            _same_process(pid)
        except OSError:
            os.close(fd)
            raise
        _MULTI[0] = True
        self._attachments.append(fd)
        self.links += 1
        return True

    def attach_kprobe(self, event: bytes, fn_name: bytes) -> None:
        self._probe("kprobe", fn_name.decode(), event, 0, False, -1)

    def attach_perf_event(self, ev_type: int, ev_config: int, fn_name: bytes, sample_period: int = 1) -> None:
        fn = self.load_func(fn_name.decode(), sys_.PROG_PERF_EVENT)
        for cpu in sys_.online_cpus():  # a counting event counts on its own CPU only
            self._perf_attach(fn, ev_type, ev_config, cpu=cpu, period=sample_period)

    def detach_all(self, wait: bool = True) -> threading.Thread | None:
        """Detach every program; maps stay readable until cleanup(). Each close waits for a grace
        period after removing its breakpoints: a uprobe_multi link ~30-50 ms for all of its
        probes here, so links are closed all at once (memleak's 12 in 55 ms); a perf-event uprobe
        ~100 ms each, and closing them from threads saves little (22 of memleak's: 2.3 s one after
        another, 1.9 s from threads), so those go in the order they were attached, which callers
        make hottest first. wait=False returns at once with the thread that closes them (the
        caller's books are frozen already: a disarmed program records nothing while its probes go)."""
        fds, self._attachments = self._attachments, []
        if not fds:
            return None
        together = self.links > 0  # the links this program made (perf events: in attach order)
        closer = threading.Thread(target=_close_all, args=(fds, together), name="memdiag-detach", daemon=True)
        closer.start()
        if wait:
            closer.join()
            return None
        return closer

    def perf_buffer_poll(self, timeout: int = 0) -> None:
        for pb in self.perf_buffers:
            pb.poll(timeout)

    # --- kernel symbols -------------------------------------------------------------------
    @staticmethod
    def ksym(address: int, show_offset: bool = False) -> bytes:
        return kernel_symbol(address, show_offset).encode()

    @staticmethod
    def ksymname(name: bytes | str) -> int:
        return _kallsyms().address_of(name.encode() if isinstance(name, str) else name)

    def cleanup(self) -> None:
        self.detach_all()
        for pb in self.perf_buffers:
            pb.close()
        self.perf_buffers.clear()
        for fn in self.funcs.values():
            os.close(fn.fd)
        self.funcs.clear()
        for t in self.tables.values():
            os.close(t.map_fd)
        self.tables.clear()


def _same_process(pid: int) -> None:
    """Checked once an event or link for pid is open (it is bound to the process that held pid
    then): TargetChanged when that was not the target memdiag resolved (it exited and another
    process took its pid, or it exec'd) and the caller closes it unused (system/identity.py)."""
    if pid > 0:
        identity.verify_pid(pid)


def _close_all(fds: list[int], together: bool) -> None:
    """Close fds in order, or all at once (together): each close waits out its own grace period."""
    if not together or len(fds) == 1:
        for fd in fds:
            os.close(fd)
        return
    threads = [threading.Thread(target=os.close, args=(fd,), daemon=True) for fd in fds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _file_offset(path: bytes, sym: bytes, sym_off: int, addr: int | None) -> int:
    """Where a uprobe goes: the file offset of sym+sym_off (or of the virtual address addr)."""
    info = elf_info(path.decode())
    if info is None:
        raise sys_.BpfError(0, f"{path.decode()}: not a readable ELF file")
    if addr is None:
        symbol = info.symbol_named(sym.decode(), exported_only=True) or info.symbol_named(sym.decode())
        if symbol is None:
            raise sys_.BpfError(0, f"{sym.decode()} not found in {path.decode()}")
        addr = symbol.address + sym_off
    offset = info.file_offset(addr)
    if offset is None:
        raise sys_.BpfError(0, f"{sym.decode() or hex(addr)} is outside the loadable segments of {path.decode()}")
    return offset


class _KernelSymbols:
    """The kernel's text symbols by address, packed: their addresses in one array and their names
    in one buffer ("\\n" before each), which holds 122,079 symbols in ~4 MiB where a list of
    ints, a list of names and a dict by name took 29 MiB of a process meant to stay small."""

    def __init__(self, addresses: array.array, names: bytes, starts: array.array):
        self.addresses, self.names, self.starts = addresses, names, starts

    def name(self, i: int) -> str:
        end = self.names.find(b"\n", self.starts[i])
        return self.names[self.starts[i] : end if end >= 0 else len(self.names)].decode(errors="replace")

    def address_of(self, name: bytes) -> int:
        """The first symbol of that name (by address), -1 when there is none."""
        at = self.names.find(b"\n" + name + b"\n")
        if at < 0 and self.names.endswith(b"\n" + name):
            at = len(self.names) - len(name) - 1
        return -1 if at < 0 else self.addresses[bisect.bisect_left(self.starts, at + 1)]


@cache
def _kallsyms() -> _KernelSymbols:
    addresses, starts, names = array.array("Q"), array.array("L"), bytearray()
    pending: list[tuple[int, bytes]] = []  # only where the file is out of address order
    with open("/proc/kallsyms", "rb") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3 or parts[1] not in (b"t", b"T", b"w", b"W"):
                continue
            address = int(parts[0], 16)
            if pending or (addresses and address < addresses[-1]):
                pending.append((address, parts[2]))
                continue
            addresses.append(address)
            starts.append(len(names) + 1)
            names += b"\n" + parts[2]
    if pending:  # modules' symbols may come out of order: sort the lot once (sorted() is stable)
        everything = sorted([(a, bytes(_name(names, starts, i))) for i, a in enumerate(addresses)] + pending)
        addresses, starts, names = array.array("Q"), array.array("L"), bytearray()
        for address, name in everything:
            addresses.append(address)
            starts.append(len(names) + 1)
            names += b"\n" + name
    return _KernelSymbols(addresses, bytes(names), starts)


def _name(names: bytearray, starts: array.array, i: int) -> bytes:
    end = starts[i + 1] - 1 if i + 1 < len(starts) else len(names)
    return names[starts[i] : end]


def kernel_symbol(address: int, show_offset: bool = False) -> str:
    syms = _kallsyms()
    i = bisect.bisect_right(syms.addresses, address) - 1
    if i < 0 or syms.addresses[i] == 0:  # without root, kallsyms shows zeros
        return "[unknown]"
    name = syms.name(i)
    return f"{name}+{hex(address - syms.addresses[i])}" if show_offset else name
