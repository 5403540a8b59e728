"""swapin: swap-ins by process (and cgroup), with the address ranges touched, plus swap devices
and swapon/swapoff calls while it runs.

Two methods, chosen by what the kernel offers: a kprobe on the kernel's swap read function (as
bcc's swapin), or, without kprobes (this project's 6.18 test kernel), major page faults from a
perf software event with their addresses: a major fault on anonymous memory can only be served
from swap, one on a file mapping is a page-cache miss and is reported apart."""

from __future__ import annotations

import threading

from memdiag.system._parse import Model
from memdiag.system.cgroup import locate_memory_cgroup
from memdiag.system.swaps import SwapDevice, read_swaps
from memdiag.system.target import Target
from memdiag.system.units import fmt_bytes

from . import bpfstats, bpfsys, kernel
from .base import Run, run_probe
from .face import Face, FactDef, ProbeResult, plain
from .growth import Spaces

REGION_SHIFT = 21
# The kernel's swap read entry point, newest name first (swap_read_folio since 6.10), as the
# kprobe PMU takes it: bytes.
SWAP_READ_FUNCTIONS = (b"swap_read_folio", b"swap_readpage")


class Region(Model):
    start: int
    end: int
    faults: int
    mapping: str  # "anon", "[heap]", a file path


class ProcessSwapins(Model):
    pid: int
    comm: str
    cgroup: str | None = None
    swapins: int  # anonymous major faults (fault method) or kernel swap reads (kprobe method)
    file_major_faults: int = 0  # page-cache misses, not swap
    regions: list[Region] = []


class SwapCall(Model):
    pid: int
    comm: str
    call: str
    path: str


class SwapinResult(ProbeResult):
    processes: list[ProcessSwapins] = []
    swap_devices: list[SwapDevice] = []
    swap_calls: list[SwapCall] = []


def requirements() -> list[kernel.Availability]:
    return [kernel.perf_events()]


def describe(r: SwapinResult, top: int) -> list[str]:
    """The result's lines under its header in `memdiag probe swapin`."""
    lines = []
    for p in r.processes[:top]:
        lines.append(
            f"  PID {p.pid:>7} {p.comm:<16} {p.swapins:>8,} swap-ins  "
            f"{p.file_major_faults:,} file major faults  cgroup {p.cgroup}"
        )
        for g in p.regions[:3]:
            lines.append(f"      {g.start:#x}-{g.end:#x} {g.mapping}: {g.faults:,}")
    for c in r.swap_calls:
        lines.append(f"  {c.call} {c.path} by PID {c.pid} ({c.comm})")
    for d in r.swap_devices:
        lines.append(f"  swap {d.filename}: {fmt_bytes(d.used)} of {fmt_bytes(d.size)} used")
    return lines


def build_options(use_kprobe: bool | None = None) -> dict[str, int | str]:
    """use_kprobe: the kprobe on the kernel's swap read too (None: where the kernel offers kprobes)."""
    if use_kprobe is None:
        use_kprobe = kernel.kprobes().available
    return {"REGION_SHIFT": REGION_SHIFT, **({"USE_KPROBE": 1} if use_kprobe else {})}


def run(
    target: Target,
    duration: float,
    top: int = 20,
    ready: threading.Event | None = None,
    use_kprobe: bool | None = None,
) -> SwapinResult:
    """use_kprobe: None takes the kprobe method where the kernel has kprobes; a test forces it to
    run the kprobe path's code on a kernel without them (the attach fails, the faults method stays)."""
    if use_kprobe is None:
        use_kprobe = kernel.kprobes().available
    spaces = Spaces()
    calls: list[SwapCall] = []
    attached: list[bool] = []
    kprobe: dict[str, str] = {}  # "on": the function probed, or "failed": why the attach failed

    def attach(bpf, _pids: set[int]) -> None:
        if attached:  # system-wide events: once, whoever joins the target later
            return
        attached.append(True)
        kprobe.update(_attach_events(bpf, use_kprobe, calls))

    def collect(bpf, _elapsed: float) -> dict:
        bpf.perf_buffer_poll(timeout=0)
        reads = {k.value: v.value for k, v in bpf["swap_reads"].items()} if "on" in kprobe else {}
        return {
            "processes": _by_process(bpf, spaces, reads)[:top],
            "swap_devices": read_swaps() or [],
            "swap_calls": calls,
            "events": (stats := bpfstats.read(bpf, bpfstats.TABLE))["events"],
            "lost": {"table_full": stats["table_full"]},
            "method": _method(use_kprobe, kprobe),
        }

    defines = build_options(use_kprobe)
    return run_probe(
        Run(
            "swapin",
            SwapinResult,
            requirements(),
            defines,
            collect,
            "",
            spaces=spaces,
            attach=attach,
            ready=ready,
        ),
        target,
        duration,
    )  # type: ignore[return-value]


def _attach_events(bpf, use_kprobe: bool, calls: list[SwapCall]) -> dict[str, str]:
    """Major faults (a perf software event), the kprobe on the swap read where asked (what became of
    it, as _attach_swap_read says), and swapon/swapoff calls into calls."""
    bpf.attach_perf_event(
        ev_type=bpfsys.PERF_TYPE_SOFTWARE,
        ev_config=bpfsys.PERF_COUNT_SW_PAGE_FAULTS_MAJ,
        fn_name=b"on_major_fault",
        sample_period=1,
    )
    kprobe = _attach_swap_read(bpf) if use_kprobe else {}

    def on_call(cpu, data, size):
        c = bpf["swap_calls"].event(data)
        calls.append(
            SwapCall(
                pid=c.pid,
                comm=c.comm.decode(errors="replace"),
                call="swapon" if c.on else "swapoff",
                path=c.path.decode(errors="replace"),
            )
        )

    bpf["swap_calls"].open_perf_buffer(on_call)
    return kprobe


def _by_process(bpf, spaces: Spaces, kprobe_reads: dict[int, int]) -> list[ProcessSwapins]:
    """Major faults by process, heaviest first: on anonymous memory a swap-in (its regions kept),
    on a file a page-cache miss; the kprobe's swap reads, where it ran, are the swap-ins."""
    procs: dict[int, ProcessSwapins] = {}
    regions: dict[int, list[Region]] = {}
    for key, count in bpf["faults"].items():
        pid = key.tgid
        p = procs.setdefault(pid, ProcessSwapins(pid=pid, comm=key.comm.decode(errors="replace"), swapins=0))
        start = key.region << REGION_SHIFT
        space = spaces.get(pid)
        mapping = space.find(start) if space else None
        label = mapping.path if mapping and mapping.path else "anon"
        if mapping is not None and mapping.is_file:
            p.file_major_faults += count.value
        else:
            p.swapins += count.value
            regions.setdefault(pid, []).append(
                Region(start=start, end=start + (1 << REGION_SHIFT), faults=count.value, mapping=label)
            )
    for pid, reads in kprobe_reads.items():
        procs.setdefault(pid, ProcessSwapins(pid=pid, comm="", swapins=0)).swapins = reads
    out = []
    for pid, p in procs.items():
        loc = locate_memory_cgroup(pid)
        p.cgroup = loc.path if loc else None
        p.regions = sorted(regions.get(pid, []), key=lambda r: r.faults, reverse=True)[:10]
        out.append(p)
    return sorted(out, key=lambda p: p.swapins, reverse=True)


def _attach_swap_read(bpf) -> dict[str, str]:
    """The kprobe on the first swap read function this kernel has: {"on": its name}, or
    {"failed": why} (no such function, or the kernel refused the probe): the faults stay counted."""
    for fn in SWAP_READ_FUNCTIONS:
        if bpf.ksymname(fn) == -1:
            continue
        try:
            bpf.attach_kprobe(event=fn, fn_name=b"count_swap_read")
        except OSError as e:
            return {"failed": f"kprobe on {fn.decode()} not attached: {e}"}
        return {"on": fn.decode()}
    names = " or ".join(f.decode() for f in SWAP_READ_FUNCTIONS)
    return {"failed": f"kprobe not attached: this kernel has no {names}"}


def _method(use_kprobe: bool, kprobe: dict[str, str]) -> str:
    faults = "major page faults on anonymous memory (perf software event)"
    if "on" in kprobe:
        return f"kprobe on the kernel's swap read ({kprobe['on']}), {faults}"
    if use_kprobe:
        return f"{faults}; {kprobe.get('failed', 'kprobe not attached')}"
    return f"{faults}; kprobes unavailable: {kernel.kprobes().reason}"


def facts_of(r: SwapinResult | None, _plan, _name) -> dict:
    if r is None or r.status != "ok" or not r.processes or not r.duration_s:
        return {}
    return {"swapin.top_rate": r.processes[0].swapins / r.duration_s}


FACE = Face(
    name="swapin",
    summary="swap-ins by process and cgroup, with the address ranges touched",
    run=plain(run),
    result=SwapinResult,
    describe=describe,
    facts=(FactDef("swapin.top_rate", "per_s", "swap-ins per second of the process paying most"),),
    facts_of=facts_of,
)
