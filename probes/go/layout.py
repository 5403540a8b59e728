"""Where a Go runtime keeps what memdiag reads from outside, per Go version: the heap profile's
bucket list (runtime.mbuckets), its GC cycle counter (runtime.mProfCycle), the sampling rate
(runtime.MemProfileRate), the goroutine list (runtime.allgs), the GC pacer's own heap counts
(runtime.gcController, where the symbol table names it), and the layouts of the structures
behind them (runtime.bucket, runtime.memRecord, runtime.g).

The variables are found by the binary's symbol table when it kept one, and otherwise (a stripped
binary, as the distributions ship them) from the runtime's own code: the one instruction of a
runtime function that loads the variable, a RIP-relative load the function table locates. Each
recipe is the Go version's source (runtime/mprof.go, runtime/proc.go), and the test suite checks
it against the symbol table of a program built with the same toolchain. A version without a
layout here is refused ("unsupported Go version X"), never read with another's offsets."""

from __future__ import annotations

from dataclasses import dataclass

import capstone
from capstone import x86

from .pclntab import GoTable


class UnsupportedGo(Exception):
    """This Go version (or build) is not one memdiag reads; the message is the line to show."""


@dataclass(frozen=True)
class Recipe:
    """The variable is what the n-th `mov` from memory of `size` bytes in `function` loads."""

    function: str
    size: int
    nth: int = 0


@dataclass(frozen=True)
class Pacer:
    """runtime.gcControllerState (runtime/mgcpacer.go): the GC's own counts of the heap, exact where
    the heap profile is an estimate. Offsets of its fields, checked against the DWARF of a program
    built with the same toolchain (tests/probes/test_goheap.py)."""

    gc_percent: int  # int32: GOGC as the program runs it (-1: off)
    last_heap_goal: int  # the heap goal as the last GC ended: the heap may grow to it before the next
    heap_marked: int  # what the last GC marked live
    heap_in_use: int  # bytes in in-use spans
    heap_free: int  # in no span, not yet returned to the OS (resident, or never touched)
    mapped_ready: int  # all the runtime holds from the OS, heap and not (what GOMEMLIMIT counts)

    @property
    def read_size(self) -> int:
        return max(self.last_heap_goal, self.heap_marked, self.heap_in_use, self.heap_free, self.mapped_ready) + 8


@dataclass(frozen=True)
class Layout:
    bucket_header: int  # runtime.bucket: next, allnext, typ, hash, size, nstk (6 words)
    mem_bucket: int  # bucketType memProfile
    max_stack: int  # runtime.maxStack: the PCs a bucket's stack holds at most
    record_size: int  # runtime.memRecordCycle: allocs, frees, alloc_bytes, free_bytes (the active one first)
    g_sched_sp: int  # runtime.g field offsets (amd64): g.sched (a gobuf) sp, pc, bp
    g_sched_pc: int
    g_sched_bp: int
    g_status: int
    g_goid: int
    g_waitsince: int
    g_waitreason: int
    g_gopc: int
    g_startpc: int
    g_read: int  # bytes of a g read to cover these fields
    dead: int  # _Gdead
    waiting: int  # _Gwaiting: parked, g.sched holds where
    scan_bit: int  # _Gscan, or'd into the status while the GC scans the stack
    wait_reasons: tuple[str, ...]
    recipes: dict[str, Recipe]
    # runtime.gcController, read where the symbol table names it (no recipe: a stripped binary goes without)
    pacer: Pacer | None = None


_WAIT_119 = (
    "", "GC assist marking", "IO wait", "chan receive (nil chan)", "chan send (nil chan)", "dumping heap",
    "garbage collection", "garbage collection scan", "panicwait", "select", "select (no cases)", "GC assist wait",
    "GC sweep wait", "GC scavenge wait", "chan receive", "chan send", "finalizer wait", "force gc (idle)",
    "semacquire", "sleep", "sync.Cond.Wait", "timer goroutine (idle)", "trace reader (blocked)",
    "wait for GC cycle", "GC worker (idle)", "preempted", "debug call",
)  # fmt: skip

LAYOUTS = {
    "go1.19": Layout(
        bucket_header=48,
        mem_bucket=1,
        max_stack=32,
        record_size=32,
        g_sched_sp=56,
        g_sched_pc=64,
        g_sched_bp=104,
        g_status=144,
        g_goid=152,
        g_waitsince=168,
        g_waitreason=176,
        g_gopc=296,
        g_startpc=312,
        g_read=320,
        dead=6,
        waiting=4,
        scan_bit=0x1000,
        wait_reasons=_WAIT_119,
        recipes={
            # mProf_FlushLocked: `head := (*bucket)(mbuckets.Load())`, its only load of a variable
            "runtime.mbuckets": Recipe("runtime.mProf_FlushLocked", 8),
            # mProf_Flush: `mProfCycle.setFlushed()` loads the cycle word first (4 bytes)
            "runtime.mProfCycle": Recipe("runtime.mProf_Flush", 4),
            # profilealloc: `c.nextSample = nextSample()` loads mcache0 (no P yet), then MemProfileRate
            "runtime.MemProfileRate": Recipe("runtime.profilealloc", 8, nth=1),
            # forEachG: lock(&allglock), then `for _, gp := range allgs`: the slice's pointer, then its length
            "runtime.allgs": Recipe("runtime.forEachG", 8),
        },
        pacer=Pacer(
            gc_percent=0,
            last_heap_goal=128,
            heap_marked=184,
            heap_in_use=304,
            heap_free=320,
            mapped_ready=344,
        ),
    )
}


def minor_version(version: str) -> str:
    """go1.19.8 -> go1.19 (the layout changes between minor versions only)."""
    parts = version.split(".")
    return ".".join(parts[:2])


def layout_for(version: str | None) -> Layout:
    if not version:
        raise UnsupportedGo("the Go version is unknown (no build info in the binary)")
    found = LAYOUTS.get(minor_version(version))
    if found is None:
        have = ", ".join(sorted(LAYOUTS))
        raise UnsupportedGo(f"unsupported Go version {version} (memdiag reads the runtime of {have})")
    return found


def find_variables(table: GoTable, layout: Layout) -> tuple[dict[str, int], str]:
    """{variable: address} and how they were found ("its symbol table" or "the runtime's code");
    a variable neither finds is missing from the dict."""
    if all(name in table.symtab for name in layout.recipes):
        return {name: table.symtab[name] for name in layout.recipes}, "its symbol table"
    found = {}
    entries = table.entries_of({recipe.function for recipe in layout.recipes.values()})
    for name, recipe in layout.recipes.items():
        addr = load_target(table, recipe, entries.get(recipe.function))
        if addr is not None:
            found[name] = addr
    return found, "the runtime's code"


_CS = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
_CS.detail = True


def load_target(table: GoTable, recipe: Recipe, entry: int | None = None) -> int | None:
    """The address the recipe's load reads: RIP-relative `mov reg, [rip+d]` loads of a module
    variable of the recipe's size, in the function's order (entry: the function's, when known)."""
    if entry is None:
        entry = table.entries_of([recipe.function]).get(recipe.function)
    if entry is None:
        return None
    code = table.read(entry, table.function_end(entry) - entry)
    if not code:
        return None
    seen = 0
    for ins in _CS.disasm(code, entry):
        if ins.id != x86.X86_INS_MOV or len(ins.operands) != 2:
            continue
        src = ins.operands[1]
        if src.type != x86.X86_OP_MEM or src.mem.base != x86.X86_REG_RIP or src.size != recipe.size:
            continue
        target = ins.address + ins.size + src.mem.disp
        if not table.moduledata.holds_data(target):
            continue
        if seen == recipe.nth:
            return target
        seen += 1
    return None
