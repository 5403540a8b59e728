"""The one list of probes. Every place that needs to know which probes exist reads it: the engine's
order of the probe table, the rule model's probe names, `memdiag probe`'s choices, `memdiag
prepare`'s program list, the fact namespaces of the probe table and the text of a result.

Adding a probe: its BPF program (bpf/NAME.c), its loader (probes/NAME.py: run(), requirements(),
describe(); build_options() if it has any) and one ProbeSpec below. Nothing here imports a loader
until a probe is run, prepared or described (importlib, by module name), so the rule model and the
command line stay light."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Literal

Options = Callable[[ModuleType, str], dict[str, int | str]]


def _targeted(module: ModuleType, target_kind: str) -> dict[str, int | str]:
    """TARGET_MODE: a `targets` map of tgids for a pid or cgroup, every process system-wide."""
    from .base import target_mode

    return {"TARGET_MODE": target_mode(target_kind, getattr(module, "FILTERED", True))}


def _no_options(module: ModuleType, target_kind: str) -> dict[str, int | str]:
    return {}


@dataclass(frozen=True)
class ProbeSpec:
    """One probe: what runs it, how it is compiled ahead of time, what it yields and shows."""

    name: str
    # compile options for a target kind ("pid", "cgroup", "system"), given its loader module
    options: Options = _targeted
    # fact namespaces its results yield (the probe table's figures), e.g. drsnoop -> reclaim.*
    facts: tuple[str, ...] = ()
    # its stacks: "allocations" (outstanding blocks: memleak) or "events" (counted events, each
    # stack with frames, bytes and count); None: no stacks for the culprit or the flame graph
    stack_kind: Literal["allocations", "events"] | None = None
    stack_events: str = ""  # what a stack's count counts, e.g. "page faults"
    module: str = ""  # the loader; memdiag.probes.NAME when empty
    # its program runs for every call of its syscalls on the host and filters the target inside:
    # the BPF run time it reports is an upper bound of the target's share
    host_wide: bool = False

    def loader(self) -> ModuleType:
        """The loader module (run, requirements, describe), imported on first use."""
        return importlib.import_module(self.module or f"{__package__}.{self.name}")

    def compile_options(self, target_kind: str) -> dict[str, int | str]:
        return self.options(self.loader(), target_kind)


@dataclass(frozen=True)
class Variant:
    """A way to run a probe that `memdiag probe` offers under its own name, with its own facts."""

    name: str
    of: str  # the probe it runs
    facts: tuple[str, ...] = ()
    pid_only: bool = False  # it needs one process (--pid)


def _faults(m: ModuleType, kind: str) -> dict[str, int | str]:
    return {**_targeted(m, kind), **m.build_options(kind)}


def _defaults(m: ModuleType, kind: str) -> dict[str, int | str]:
    return {**_targeted(m, kind), **m.build_options()}


def _swapin(m: ModuleType, kind: str) -> dict[str, int | str]:
    from .kernel import kprobes

    return {**_targeted(m, kind), **m.build_options(kprobes().available)}


def _oomkill(m: ModuleType, kind: str) -> dict[str, int | str]:
    return m.build_options()  # the OOM killer is watched for every process: no targets map


# The engine's order: the order of the probe table in a report.
PROBES: tuple[ProbeSpec, ...] = (
    ProbeSpec("faults", _faults, facts=("faults",), stack_kind="events", stack_events="page faults"),
    ProbeSpec("memleak", _defaults, facts=("memleak",), stack_kind="allocations"),
    ProbeSpec("brkstack", _defaults, facts=("brk",), stack_kind="events", stack_events="brk() calls", host_wide=True),
    ProbeSpec(
        "mmapsnoop", _defaults, facts=("mmap",), stack_kind="events", stack_events="mmap() calls", host_wide=True
    ),
    ProbeSpec("oomkill", _oomkill),
    ProbeSpec("swapin", _swapin, facts=("swapin",)),
    ProbeSpec("vmscan"),
    ProbeSpec("drsnoop", facts=("reclaim",)),
)
VARIANTS: tuple[Variant, ...] = (
    # memleak, then the reachability scan of its outstanding blocks
    Variant("reach", of="memleak", facts=("reach",), pid_only=True),
)
# Compiled ahead of time but not a probe of its own: the rate count that prices memleak.
HELPERS: tuple[ProbeSpec, ...] = (ProbeSpec("ratecount", _no_options),)


class Registry:
    """The probes and variants, looked up by name. A test may build one with an extra probe."""

    def __init__(self, probes: tuple[ProbeSpec, ...], variants: tuple[Variant, ...], helpers: tuple[ProbeSpec, ...]):
        self.probes, self.variants, self.helpers = probes, variants, helpers

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

    def variant(self, name: str) -> Variant | None:
        return next((v for v in self.variants if v.name == name), None)

    def cli_names(self) -> list[str]:
        """What `memdiag probe` offers: every probe and every variant."""
        return sorted(self.names + tuple(v.name for v in self.variants))

    def fact_rows(self) -> dict[str, str]:
        """Fact namespace -> the row of the probe table that shows it."""
        rows = {ns: p.name for p in self.probes for ns in p.facts}
        rows.update({ns: v.name for v in self.variants for ns in v.facts})
        return rows

    def event_stacks(self) -> tuple[ProbeSpec, ...]:
        """Probes whose stacks count events (page faults, brk, mmap), in order."""
        return tuple(p for p in self.probes if p.stack_kind == "events")

    def programs(self, target_kind: str) -> list[tuple[str, dict[str, int | str]]]:
        """(program, compile options) of every BPF program a diagnosis may load: helpers first
        (pricing memleak is the engine's first BPF step), then each probe."""
        return [(p.name, p.compile_options(target_kind)) for p in self.helpers + self.probes]


REGISTRY = Registry(PROBES, VARIANTS, HELPERS)
