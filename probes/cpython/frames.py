"""The Python stacks the BPF walk recorded (bpf/pyframes.h: per stack key, each frame's code
object and instruction pointer) turned into frames people read, `handle_order (/srv/orders.py:42)
[python]`, and mixed with the native stack: each native `_PyEval_EvalFrameDefault` is the Python
frames that one call of it ran (up to the frame marked last in its call), as py-spy's --native
shows them. A probe that walks Python frames keeps one PythonStacks for its run: it registers each
CPython target's layout in the program's py_procs map, and reads the stacks back at the end."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from memdiag.system._parse import Model
from memdiag.system.units import fmt_bytes, fmt_duration, fmt_number

from ..procmaps import AddressSpace
from . import MODULE, STDLIB_MODULE
from .code import Codes
from .holder import Holders
from .memory import Memory
from .target import PythonProcess, locate

LAST_IN_CALL = 1 << 63
ADDRESS_MASK = LAST_IN_CALL - 1
PY_TRUNCATED, PY_READ_FAILED = 1, 2  # py_stack.flags (bpf/memdiag.h)
EVAL_LOOP = frozenset({"_PyEval_EvalFrameDefault"})
MAX_THREADS = 64  # thread states looked through (bpf/memdiag.h's PY_MAX_THREADS)
C_LIBRARY = ("libc.so.6", "libm.so.6")  # native frames a Python call path's allocation may pass through
# memleak's one stack of pymalloc's arenas (objects of 512 bytes or less), whichever Python line
# mapped each: an arena is mapped by the line that found the last one full, which is no sample of
# the lines that fill it (pools run out in a cycle: in a trial of 11 arenas, 6 were mapped by a
# counter's `n += 1`, making 32 bytes an event, and 5 by the function keeping ~500 bytes an event,
# each line's series climbing then level in turn while the arenas together climbed). Together
# they are the interpreter's small-object memory, whose trend is the program's; page faults first
# touching their pages (a sample by bytes) name the line.
ARENAS = ("python", "mmap", "pymalloc arenas")


@dataclass(frozen=True)
class PyFrame:
    qualname: str | None  # None: the code object could not be read (gone, or not one)
    filename: str | None = None
    line: int | None = None
    last_in_call: bool = False
    stdlib: bool = False

    @property
    def module(self) -> str:
        return STDLIB_MODULE if self.stdlib else MODULE

    @property
    def function(self) -> str | None:
        """What a culprit and the facts say: `handle_order (orders.py:42)`."""
        if self.qualname is None:
            return None
        return f"{self.qualname} ({os.path.basename(self.filename or '?')}{_at(self.line)})"

    def __str__(self) -> str:
        if self.qualname is None:
            return f"[unknown] [{self.module}]"
        return f"{self.qualname} ({self.filename}{_at(self.line)}) [{self.module}]"


def _at(line: int | None) -> str:
    return f":{line}" if line is not None else ""


def mixed(frames: list[str], functions: list[str | None], python: list[PyFrame]) -> tuple[list[str], list]:
    """The native stack (frames and their function names, leaf first) with each eval-loop frame
    replaced by the Python frames it ran; Python frames no native frame accounts for (the native
    unwind stopped short) follow the native ones, outermost last."""
    out_frames: list[str] = []
    out_functions: list[str | None] = []
    queue = list(python)
    for frame, function in zip(frames, functions, strict=True):
        if function in EVAL_LOOP and queue:
            while queue:
                py = queue.pop(0)
                out_frames.append(str(py))
                out_functions.append(py.function)
                if py.last_in_call:
                    break
            continue
        out_frames.append(frame)
        out_functions.append(function)
    for py in queue:
        out_frames.append(str(py))
        out_functions.append(py.function)
    return out_frames, out_functions


class PythonReading(Model):
    """What a probe's walk of Python frames read in its run, for its result and the report."""

    read: dict[int, str] = {}  # pid -> the interpreter and where its layout came from
    refused: dict[int, str] = {}  # pid -> why its frames were not read ("unsupported version 3.10.13")
    stacks: int = 0  # stacks that carry Python frames
    unreadable: int = 0  # frames whose code object could not be read back (gone, or not one)
    truncated: int = 0  # stacks deeper than the walk records: their outermost frames are missing
    read_failed: int = 0  # stacks whose walk stopped at a frame it could not read
    max_frames: int = 0  # frames the walk records at an event (PY_MAX_FRAMES, from the program's map)
    arena_stacks: int = 0  # Python call paths whose interpreter mmap()ed memory (pymalloc's arenas)
    memory_reads: int = 0  # reads of the targets' memory (/proc/PID/mem) to name frames and holders
    memory_bytes: int = 0
    memory_s: float = 0.0  # memdiag's time reading them, not the target's (it is never stopped for it)


def reading_lines(reading: PythonReading | None) -> list[str]:
    """`memdiag probe`'s lines on the Python frames: what was read of which process, or why not."""
    if reading is None:
        return []
    lines = [f"  python: PID {pid}: {what}" for pid, what in sorted(reading.read.items())]
    lines += [f"  python: PID {pid}: not read: {why}" for pid, why in sorted(reading.refused.items())]
    if reading.read:
        lines.append(
            f"    {fmt_number(reading.stacks)} stacks with Python frames; {fmt_number(reading.memory_reads)} reads "
            f"({fmt_bytes(reading.memory_bytes)}) of its memory in {fmt_duration(reading.memory_s)}"
        )
    return lines


def caveats(reading: PythonReading | None) -> list[str]:
    """What a reader of the Python frames should know: targets whose frames were not read and
    why, stacks cut short, frames whose code could not be read back, and how arenas are named."""
    if reading is None:
        return []
    out = [f"PID {pid}: its Python frames were not read: {why}" for pid, why in sorted(reading.refused.items())]
    if reading.truncated:
        out.append(
            f"{reading.truncated} Python stacks were deeper than the {reading.max_frames} frames the walk records "
            "at an event: their outermost frames are missing"
        )
    if reading.unreadable or reading.read_failed:
        out.append(
            f"{reading.unreadable} Python frames are [unknown]: their code object was gone or not one when read "
            f"back (never named from a guess); {reading.read_failed} walks stopped at a frame they could not read"
        )
    if reading.memory_reads:
        out.append(
            f"To name Python frames and holders memdiag read {fmt_bytes(reading.memory_bytes)} of the target's memory "
            f"in {fmt_number(reading.memory_reads)} reads of /proc/PID/mem ({fmt_duration(reading.memory_s)} of "
            "memdiag's time; the target is not stopped for them, nothing is written)"
        )
    if reading.arena_stacks:
        out.append(
            "Python objects of 512 bytes or less come from pymalloc's 1 MiB arenas: an arena's stack names the "
            "Python line whose allocation found pymalloc full, a sample of the lines that allocate while memory grows"
        )
    return out


@dataclass
class _Target:
    proc: PythonProcess
    memory: Memory
    codes: Codes
    holders: Holders | None = None


@dataclass
class PythonStacks:
    """The CPython processes of one probe run: which could be read (and with which layout), which
    not and why, the stacks' frames, and what reading the targets' memory cost."""

    targets: dict[int, _Target] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)  # pid -> why its frames are not read
    truncated: int = 0  # stacks deeper than the walk's PY_MAX_FRAMES
    read_failed: int = 0  # stacks whose walk met a frame it could not read
    with_frames: int = 0  # stacks mixed with Python frames
    max_frames: int = 0
    arenas: set = field(default_factory=set)  # Python call paths that mmap()ed (pymalloc's arenas)

    def register(self, bpf, pid: int, space: AddressSpace | None) -> PythonProcess | None:
        """Put pid's layout in the program's py_procs map when it is a CPython memdiag can read;
        None otherwise (the reason kept for anything but a process that runs no CPython)."""
        if pid in self.targets:
            return self.targets[pid].proc
        memory = Memory(pid)
        proc, why = locate(pid, space, memory)
        if proc is None:
            memory.close()
            if why:
                self.refused[pid] = why
            return None
        table = bpf["py_procs"]
        table[table.Key(pid)] = table.Leaf(**proc.layout.py_proc(proc.interpreters_head))
        self.targets[pid] = _Target(proc, memory, Codes(proc, memory))
        self.seed_threads(bpf, pid)
        return proc

    def attacher(self, spaces, enabled: bool = True) -> Callable:
        """A probe's attach(bpf, pids) step that registers each CPython target (spaces: the probe's
        growth.Spaces); enabled False: none (a system-wide count per process walks no frames)."""

        def attach(bpf, pids: set[int]) -> None:
            for pid in pids if enabled else ():
                self.register(bpf, pid, spaces.get(pid))

        return attach

    def seed_threads(self, bpf, pid: int) -> int:
        """Where the target has a pid namespace of its own (a container), the walk cannot find a
        thread's state by the id BPF sees: put each thread state in the program's py_threads map
        under that id, with the id the thread state holds (NSpid's last). Threads born later are
        found again at the next call. Returns the thread states put in."""
        target = self.targets.get(pid)
        inner = _namespaced_tids(pid)
        if target is None or not inner:
            return 0
        lay, mem = target.proc.layout, target.memory
        table, now, seeded = bpf["py_threads"], time.clock_gettime_ns(time.CLOCK_MONOTONIC), 0
        interp = mem.u64(target.proc.interpreters_head)
        tstate = mem.u64(interp + lay.interp_threads_head) if interp else None
        for _ in range(MAX_THREADS):
            if not tstate:
                break
            native = mem.u64(tstate + lay.tstate_native_thread_id)
            if native in inner:
                table[table.Key(inner[native])] = table.Leaf(tstate=tstate, looked_ns=now, native_tid=native)
                seeded += 1
            tstate = mem.u64(tstate + lay.tstate_next)
        return seeded

    def frames(self, bpf, key, pid: int) -> list[PyFrame]:
        """The Python frames recorded with a stack key (innermost first); [] where none were."""
        target = self.targets.get(pid)
        if target is None:
            return []
        try:
            record = bpf["pystacks"][key]
        except KeyError:
            return []
        self.max_frames = len(record.frames)
        self.truncated += bool(record.flags & PY_TRUNCATED)
        self.read_failed += bool(record.flags & PY_READ_FAILED)
        pairs = [(record.frames[i].code, record.frames[i].instr) for i in range(min(record.depth, len(record.frames)))]
        self.with_frames += bool(pairs)
        return self.resolve(target, pairs)

    def mix(self, bpf, key, pid: int, frames: list[str], functions: list) -> tuple[list[str], list]:
        """A native stack (frames and function names) with the Python frames recorded for its key."""
        python = self.frames(bpf, key, pid)
        return mixed(frames, functions, python) if python else (frames, functions)

    def group(self, pid: int, frames: list[str], by_entry: bool = False) -> tuple:
        """What stacks are merged by: a stack whose frames below its first Python frame all lie in
        the interpreter or the C library is its Python call path (which C path of the interpreter
        asked for the memory, a new arena for a tuple or for a str, is incidental: one line of
        Python makes both), and by_entry with the entry point it called (memleak: mmap, pymalloc's
        arenas, apart from malloc); any other stack is its whole frames (a C library's own, called by
        ctypes). Page faults of one Python line at several instructions of the interpreter merge."""
        target = self.targets.get(pid)
        first = next((i for i, f in enumerate(frames) if f.endswith((f"[{MODULE}]", f"[{STDLIB_MODULE}]"))), None)
        if target is None or first is None:
            return tuple(frames)
        interpreter = f"[{os.path.basename(target.proc.module)}]"
        native = {interpreter, *(f"[{m}]" for m in C_LIBRARY)}
        if all(f[f.rfind(" [") + 1 :] in native for f in frames[:first] if " [" in f):
            if frames[0].startswith("mmap"):
                self.arenas.add((pid, *frames[first:]))
                # the interpreter itself mapped it (not the C library for it: a thread's stack is
                # mapped by pthread_create), so pymalloc's arena: one pool shared by every line that
                # makes small objects, whichever line found it full (ARENAS)
                if by_entry and all(f.endswith(interpreter) for f in frames[1:first] if " [" in f):
                    return ARENAS
            return ("python", frames[0] if by_entry else "", *frames[first:])
        return tuple(frames)

    @staticmethod
    def is_arenas(group: tuple) -> bool:
        """Whether a group (group(..., by_entry=True)) is the interpreter's arenas."""
        return group == ARENAS

    def namer(self, pid: int, bpf=None) -> Callable[[int, int, int], str | None] | None:
        """What names a held block in Python's terms for the reachability scan: (address of the
        word that points at it, its start, its size) -> "`__main__.failed` (a list)" or None. With
        the probe's program (bpf), the globals of the frames its walk recorded are indexed too."""
        target = self.targets.get(pid)
        if target is None:
            return None
        if target.holders is None:
            seen = self.frame_globals(bpf, pid, target) if bpf is not None else {}
            target.holders = Holders(target.proc, target.memory, frame_globals=seen)
        return target.holders.name

    def own_modules(self, pid: int) -> frozenset[str]:
        """The interpreter's module in pid (whose static data are its own records: pymalloc's arenas
        array and usedpools, free lists), or none where pid's Python is not read."""
        target = self.targets.get(pid)
        return frozenset((target.proc.module,)) if target is not None else frozenset()

    def frame_globals(self, bpf, pid: int, target: _Target) -> dict[int, str | None]:
        """The globals dicts of pid's recorded frames -> the file of a frame that ran with them."""
        out: dict[int, str | None] = {}
        try:
            records = bpf["pystacks"].items()
        except KeyError:
            return out
        for key, record in records:
            if getattr(key, "tgid", pid) != pid:
                continue
            for i in range(min(record.depth, len(record.frames))):
                frame = record.frames[i]
                if frame.globals and frame.globals not in out:
                    code = target.codes.code(frame.code)
                    out[frame.globals] = code.filename if code is not None else None
        return out

    def reading(self) -> PythonReading:
        cost = self.cost()
        return PythonReading(
            read={pid: t.proc.describe() for pid, t in self.targets.items()},
            refused=dict(self.refused),
            stacks=self.with_frames,
            unreadable=sum(t.codes.invalid for t in self.targets.values()),
            truncated=self.truncated,
            read_failed=self.read_failed,
            max_frames=self.max_frames,
            arena_stacks=len(self.arenas),
            memory_reads=int(cost["reads"]),
            memory_bytes=int(cost["bytes"]),
            memory_s=round(cost["seconds"], 6),
        )

    def resolve(self, target: _Target, pairs: list[tuple[int, int]]) -> list[PyFrame]:
        out = []
        stdlib = target.proc.stdlib
        for code_addr, instr in pairs:
            code = target.codes.code(code_addr)
            last = bool(instr & LAST_IN_CALL)
            if code is None:
                out.append(PyFrame(qualname=None, last_in_call=last))
                continue
            line = code.line(target.proc.layout.code_adaptive, instr & ADDRESS_MASK)
            out.append(
                PyFrame(
                    qualname=code.qualname,
                    filename=code.filename,
                    line=line,
                    last_in_call=last,
                    stdlib=_in_stdlib(code.filename, stdlib),
                )
            )
        return out

    def cost(self) -> dict[str, float]:
        """Reads of the targets' memory, summed over them."""
        total: dict[str, float] = {"reads": 0, "bytes": 0, "failed": 0, "seconds": 0.0}
        for t in self.targets.values():
            for k, v in t.memory.cost().items():
                total[k] += v
        return total

    def close(self) -> None:
        for t in self.targets.values():
            t.memory.close()


def _namespaced_tids(pid: int) -> dict[int, int]:
    """Thread id in the process's own pid namespace -> the id memdiag's /proc (and BPF) give it,
    for the threads whose two ids differ (NSpid: outermost first, innermost last)."""
    out: dict[int, int] = {}
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except (OSError, ValueError):
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                line = next((x for x in f if x.startswith("NSpid:")), "")
        except OSError:
            continue
        ids = [int(v) for v in line.split()[1:]]
        if len(ids) > 1 and ids[-1] != ids[0]:
            out[ids[-1]] = ids[0]
    return out


def _in_stdlib(filename: str, stdlib: str | None) -> bool:
    """A file of the interpreter's own library (not its site-packages), or a frozen module."""
    if filename.startswith("<frozen "):
        return True
    if stdlib is None or not filename.startswith(stdlib.rstrip("/") + "/"):
        return False
    rest = filename[len(stdlib.rstrip("/")) + 1 :]
    return not rest.startswith(("site-packages/", "dist-packages/"))
