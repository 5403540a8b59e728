"""The one list of probes, and the one list of runtimes. Every place that needs to know which probes
exist reads it: the engine's order of the probe table, the rule model's probe names and fact
catalog, `memdiag probe`'s choices and options, `memdiag prepare`'s program list, the report's
stacks, rows and sections. Every place that needs to know a runtime asks it for the target's
runtime face (recognise) and reads the face (probes/runtime.py).

Adding a probe: its module with its face (probes/face.py says what a face declares), its BPF
program if it has one (bpf/NAME.c), and one ProbeSpec below. Adding a runtime: its package with its
face (probes/runtime.py) and one RuntimeSpec below. Nothing here imports a probe's or a runtime's
module until its face is asked for (importlib, by module name): the rule model and the command line
read the names without loading any probe."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from memdiag.system._parse import read_text
from memdiag.system.ledger import AnonPart
from memdiag.system.runtime import Runtime, effective_ids_of, executable_mappings

from .face import Face, FactDef
from .runtime import RuntimeFace, Seen

Options = Callable[[ModuleType, str], dict[str, int | str]]


def target_mode(target_kind: str, filtered: bool = True) -> int:
    """TARGET_MODE of a program: 1 keeps a `targets` map of tgids, 0 sees every process."""
    return 1 if filtered and target_kind != "system" else 0


def _targeted(module: ModuleType, target_kind: str) -> dict[str, int | str]:
    """TARGET_MODE: a `targets` map of tgids for a pid or cgroup, every process system-wide."""
    return {"TARGET_MODE": target_mode(target_kind, getattr(module, "FILTERED", True))}


def _no_options(module: ModuleType, target_kind: str) -> dict[str, int | str]:
    return {}


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: where its face is, how its BPF program is compiled ahead of time."""

    name: str
    # compile options for a target kind ("pid", "cgroup", "system"), given its loader module
    options: Options = _targeted
    module: str = ""  # the module holding FACE; memdiag.probes.NAME when empty
    bpf: bool = True  # it loads bpf/NAME.c (False: it reads a runtime's own instruments)
    # its program runs for every call of its syscalls on the host and filters the target inside:
    # the BPF run time it reports is an upper bound of the target's share
    host_wide: bool = False

    def loader(self) -> ModuleType:
        """The probe's module, imported on first use."""
        return importlib.import_module(self.module or f"{__package__}.{self.name}")

    def face(self) -> Face:
        face = self.loader().FACE
        if face.name != self.name:
            raise ValueError(f"probe {self.name!r}: its module's FACE is named {face.name!r} (probes/registry.py)")
        return face

    def compile_options(self, target_kind: str) -> dict[str, int | str]:
        return self.options(self.loader(), target_kind)


@dataclass(frozen=True)
class Variant:
    """A way to run a probe that `memdiag probe` offers under its own name, with options set."""

    name: str
    of: str  # the probe it runs
    summary: str = ""  # one line for `memdiag probe --help`
    options: tuple[tuple[str, object], ...] = ()  # ctx.options it sets for the probe
    needs_pid: str = ""  # why it needs one process (--pid), refused without; empty: it does not
    refuses: tuple[str, ...] = ()  # options of the probe it cannot run with (a refusal, as without --pid)


def _faults(m: ModuleType, kind: str) -> dict[str, int | str]:
    return {**_targeted(m, kind), **m.build_options(kind)}


def _defaults(m: ModuleType, kind: str) -> dict[str, int | str]:
    return {**_targeted(m, kind), **m.build_options()}


def _oomkill(m: ModuleType, kind: str) -> dict[str, int | str]:
    return m.build_options()  # the OOM killer is watched for every process: no targets map


# The engine's order: the order of the probe table in a report.
PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("faults", _faults),
    # a Go program's own heap profile and goroutines, read from its memory: before memleak, whose
    # stacks see only a Go program's C allocations (its culprit is the heap profile's when it ran)
    ProbeSpec("goheap", _no_options, module="memdiag.probes.go.heap", bpf=False),
    ProbeSpec("memleak", _defaults),
    ProbeSpec("brkstack", _defaults, host_wide=True),
    ProbeSpec("mmapsnoop", _defaults, host_wide=True),
    # descriptors (sockets, pipes, eventfds ...) by the stack that created them, and which stay open
    ProbeSpec("fdstack", _defaults, host_wide=True),
    # tmpfs files, memfds and System V segments still there, by the stack that made them
    ProbeSpec("shmwriter", _defaults, host_wide=True),
    # kernel slab allocations the target's calls left outstanding, by kernel and user stack
    ProbeSpec("kmemstack", _defaults, host_wide=True),
    # one function's own calls to the allocator, where tracing them all is over the budget
    ProbeSpec("sites", _no_options, module="memdiag.probes.memleak.narrowed"),
    ProbeSpec("oomkill", _oomkill),
    ProbeSpec("swapin", _defaults),
    ProbeSpec("vmscan"),
    ProbeSpec("drsnoop"),
    # V8's heap against memory outside it, from smaps
    ProbeSpec("nodeheap", _no_options, module="memdiag.probes.node.heap", bpf=False),
    # a JVM's own flight recorder through its attach socket: no BPF
    ProbeSpec("jfr", module="memdiag.probes.jvm.view", bpf=False),
    ProbeSpec("histogram", module="memdiag.probes.jvm.histogram", bpf=False),
)
VARIANTS: tuple[Variant, ...] = (
    # memleak, then the reachability scan of its outstanding blocks
    Variant(
        "reach",
        of="memleak",
        summary="memleak, then a scan of the process's memory for what still points at each block (one process)",
        options=(("scan_reach", True),),
        needs_pid="scans one process's memory: give -p PID (user-space allocations)",
        refuses=("kernel",),
    ),
)


@dataclass(frozen=True)
class RuntimeSpec:
    """One runtime: where its face is (RUNTIME in memdiag.probes.NAME, its package's __init__)."""

    name: str
    module: str = ""  # the module holding RUNTIME; memdiag.probes.NAME when empty

    def face(self) -> RuntimeFace:
        face = importlib.import_module(self.module or f"{__package__}.{self.name}").RUNTIME
        if face.name != self.name:
            raise ValueError(f"runtime {self.name!r}: its RUNTIME is named {face.name!r} (probes/registry.py)")
        return face


# The order of recognition (probes/runtime.py): runtimes told by a mapping, then Go by its executable.
RUNTIMES: tuple[RuntimeSpec, ...] = (
    RuntimeSpec("cpython"),
    RuntimeSpec("node"),
    RuntimeSpec("jvm"),
    RuntimeSpec("go"),
)
# Readers of a native allocator's own bookkeeping in the target's memory: each module's
# anon_parts(pid) -> ([AnonPart], [what it did not read]) gives the parts of the process's anonymous
# memory the allocator holds (in use, free, unused top); the process ledger's split asks each.
ALLOCATOR_READERS: tuple[str, ...] = ("memdiag.probes.memleak.glibcheap",)
# Compiled ahead of time but not a probe of its own: the rate count that prices memleak.
HELPERS: tuple[ProbeSpec, ...] = (ProbeSpec("ratecount", _no_options, module="memdiag.probes.memleak.ratecount"),)


class Registry:
    """The probes, variants and runtimes, looked up by name. A test may build one with an extra
    probe or runtime."""

    def __init__(
        self,
        probes: tuple[ProbeSpec, ...],
        variants: tuple[Variant, ...],
        helpers: tuple[ProbeSpec, ...],
        runtimes: tuple[RuntimeSpec, ...] = RUNTIMES,
    ):
        self.probes, self.variants, self.helpers, self.runtimes = probes, variants, helpers, runtimes

    @property
    def names(self) -> tuple[str, ...]:
        """The probes a rule may ask for, in the engine's order."""
        return tuple(p.name for p in self.probes)

    def spec(self, name: str) -> ProbeSpec:
        """A probe or a variant's probe."""
        of = next((v.of for v in self.variants if v.name == name), name)
        for p in self.probes:
            if p.name == of:
                return p
        raise KeyError(f"no probe named {name!r} (probes/registry.py)")

    def face(self, name: str) -> Face:
        return self.spec(name).face()

    def faces(self) -> list[Face]:
        """Every probe's face, in the engine's order."""
        return [p.face() for p in self.probes]

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def cli_names(self) -> list[str]:
        """What `memdiag probe` offers: every probe and every variant."""
        return sorted(self.names + tuple(v.name for v in self.variants))

    def summaries(self) -> dict[str, str]:
        """What `memdiag probe` offers, each with its one-line summary (the face's, or the variant's)."""
        variants = {v.name: v.summary for v in self.variants}
        return {name: variants[name] if name in variants else self.face(name).summary for name in self.cli_names()}

    def fact_defs(self) -> list[FactDef]:
        """The catalog entries of every probe's facts, in the engine's order, then every runtime's."""
        return [f for face in self.faces() for f in face.facts] + [f for r in self.runtime_faces() for f in r.facts]

    # --- runtimes ---------------------------------------------------------------------------------
    def runtime_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.runtimes)

    def runtime_faces(self) -> list[RuntimeFace]:
        return [r.face() for r in self.runtimes]

    def runtime(self, name: str | None) -> RuntimeFace | None:
        """The face of the runtime of this name; None for none (native code) or a name not listed
        (a report written by a release that knew another runtime)."""
        return next((r.face() for r in self.runtimes if r.name == name), None) if name else None

    def recognise(self, pid: int, proc_root: Path = Path("/proc")) -> Runtime | None:
        """The runtime whose code the process runs, with its version (probes/runtime.py: the first
        executable mapping a runtime claims, else the executable as each runtime reads it), or None
        (native code, or the process is gone)."""
        proc = proc_root / str(pid)
        text = read_text(proc / "maps")
        if text is None:
            return None
        faces = self.runtime_faces()
        mapped = list(executable_mappings(text))
        seen = Seen(pid=pid, path=None, mapped=None, root=proc / "root", ids=effective_ids_of(pid, proc_root),
                    exe=proc / "exe", exe_path=mapped[0][1] if mapped else None)  # fmt: skip
        for span, path in mapped:
            face = next((f for f in faces if f.claims(path)), None)
            if face is not None:
                found = face.recognise(replace(seen, path=path, mapped=proc / "map_files" / span))
                if found is not None:
                    return found
        return next((r for f in faces if f.maps is None and (r := f.recognise(seen)) is not None), None)

    def allocator_parts(self, pid: int) -> tuple[list[AnonPart], list[str]]:
        """What the native allocators' readers say of the process's anonymous memory, and what they
        did not read."""
        parts: list[AnonPart] = []
        unread: list[str] = []
        for module in ALLOCATOR_READERS:
            try:
                got, missed = importlib.import_module(module).anon_parts(pid)
            except Exception as e:  # a reader of the target's memory fails in one line, the report goes on
                got, missed = [], [f"{module.rsplit('.', 1)[-1]}: not read ({type(e).__name__}: {e})"]
            parts += got
            unread += missed
        return parts, unread

    def retired_facts(self) -> dict[str, str]:
        """Facts a probe yielded once -> what decides now (a rule naming one is told)."""
        return {name: why for face in self.faces() for name, why in face.retired}

    def figure_rows(self) -> dict[str, str]:
        """Fact name -> the row of the probe table whose figures show it."""
        return {f.name: f.row or face.name for face in self.faces() for f in face.facts if f.figure}

    def stack_faces(self) -> list[Face]:
        """Probes with stacks: allocation stacks first, then event stacks, each in the engine's order."""
        with_stacks = [f for f in self.faces() if f.stacks is not None]
        return [f for kind in ("allocations", "events") for f in with_stacks if f.stacks.kind == kind]  # type: ignore[union-attr]

    def programs(self, target_kind: str) -> list[tuple[str, dict[str, int | str]]]:
        """(program, compile options) of every BPF program a diagnosis may load: helpers first
        (pricing memleak is the engine's first BPF step), then each probe that has one."""
        return [(p.name, p.compile_options(target_kind)) for p in self.helpers + self.probes if p.bpf]


REGISTRY = Registry(PROBES, VARIANTS, HELPERS, RUNTIMES)
