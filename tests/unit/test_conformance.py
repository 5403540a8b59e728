"""Every probe is its face (probes/face.py), and the diagnosis reads nothing else of it: each
registered probe's facts are the catalog's and the catalog's are produced; each probe's rows, stacks
and sections reach report.md, report.json and report.html through assemble(); and a probe added as
one module plus one registry entry drives a verdict through a playbook rule with no change to
diagnose/ or rules/.

A new probe adds its example result to EXAMPLES below (a result its run() could return, with what
its facts need): the tests fail for a registered probe without one."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from memdiag.diagnose.assemble import assemble
from memdiag.diagnose.culprit import default_classes
from memdiag.diagnose.factset import window_facts
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.render import render_all
from memdiag.diagnose.snapshot import Snapshot
from memdiag.diagnose.verdict import EngineResult, verdict_of
from memdiag.diagnose.workflow import load_rules
from memdiag.probes.brkstack import BrkResult
from memdiag.probes.drsnoop import DrsnoopResult, ProcessReclaim
from memdiag.probes.face import Plan, ProbeResult, StackReach, TracingCost
from memdiag.probes.faults import FaultsResult
from memdiag.probes.fdstack import PRICING as FD_PRICING
from memdiag.probes.fdstack import FdResult, FdStack, FdTotal
from memdiag.probes.go.heap import GoHeapResult, GoroutineGroup, GoStack
from memdiag.probes.growth import StackGrowth
from memdiag.probes.hostwide import decision as wide_decision
from memdiag.probes.jvm.histogram import ClassGrowth, HistogramPlan, HistogramResult
from memdiag.probes.jvm.plan import JfrPlan
from memdiag.probes.jvm.plan import _over_budget as jfr_over_budget
from memdiag.probes.jvm.probe import JfrResult
from memdiag.probes.jvm.recording import Allocating, Held, JavaFrame
from memdiag.probes.kmemstack import PRICING as KMEM_PRICING
from memdiag.probes.kmemstack import CacheTotal, KmemResult, KmemStack
from memdiag.probes.memleak import LeakStack, MemleakResult
from memdiag.probes.memleak.narrowed import SitesResult, SiteStack
from memdiag.probes.memleak.plan import decision
from memdiag.probes.memleak.reach import ReachScan
from memdiag.probes.mmapsnoop import MapStack, MmapResult
from memdiag.probes.node.heap import NodeHeapResult
from memdiag.probes.oomkill import OomEvent, OomKillResult
from memdiag.probes.registry import REGISTRY
from memdiag.probes.shmwriter import PRICING as SHM_PRICING
from memdiag.probes.shmwriter import Place, WriterResult, WriterStack
from memdiag.probes.swapin import ProcessSwapins, SwapinResult
from memdiag.probes.vmscan import ReclaimLatency, VmscanResult
from memdiag.rules.catalog import facts as catalog
from memdiag.rules.engine import run_rules
from memdiag.system.ledger import ledger_fact_defs
from memdiag.system.meminfo import MemInfo
from memdiag.system.process import ProcessMemory
from memdiag.system.target import Target
from memdiag.system.vmstat import VmStat

ROOT = Path(__file__).resolve().parents[2]
MiB, GiB = 1 << 20, 1 << 30
T0 = 1_800_000_000.0
PID = 500
FRAMES = ["malloc+0x0 [libc.so.6]", "grow_orders+0x12 [orderd]", "main+0x9 [orderd]"]
FUNCTIONS = ["malloc", "grow_orders", "main"]
KERNEL_FRAMES = ["kmem_cache_alloc_lru_noprof+0x2 [kernel]", "__d_alloc+0x2d [kernel]", "d_alloc_parallel+0x3 [kernel]"]
KERNEL_FUNCTIONS = ["kmem_cache_alloc_lru_noprof", "__d_alloc", "d_alloc_parallel"]


def _growth(count: int, nbytes: int, **kw) -> dict:
    return dict(frames=FRAMES, functions=FUNCTIONS, count=count, bytes=nbytes, pid=PID, method="eh_frame", **kw)


def _leak_stack(reach: StackReach | None) -> LeakStack:
    return LeakStack(
        frames=FRAMES, functions=FUNCTIONS, forwards=[False] * 3, pid=PID, method="frame pointers",
        outstanding_bytes=24 * MiB, outstanding_count=1536, allocs=10752, frees=9216, alloc_bytes=168 * MiB,
        freed_bytes=144 * MiB, oldest_age_s=11.0, series=[4 * MiB, 8 * MiB, 12 * MiB, 16 * MiB, 20 * MiB, 24 * MiB],
        reach=reach,
    )  # fmt: skip


def _memleak(scan: ReachScan, reach: StackReach | None) -> MemleakResult:
    return MemleakResult(
        name="memleak", status="ok", method="uprobes", duration_s=12.0, series_times=[0, 2, 4, 6, 8, 10],
        stacks=[_leak_stack(reach)], folded=["main;grow_orders;malloc 25165824"], reach_scan=scan,
        tracing_cost=TracingCost(attached_s=12.0, probes_ns=1.2e8, cpu_ns=1.5e8, measured_ns=1.5e8),
    )  # fmt: skip


SCANNED = ReachScan(status="ran", paused_ms=31.0, scanned_bytes=40 * MiB, regions=8, threads=2, blocks=1536)
LEAKED = StackReach(leaked_count=1200, leaked_bytes=18 * MiB, unreferenced_count=1100, anchored_count=336,
                    anchored_bytes=6 * MiB, anchor="`orders` in orderd's .bss", anchor_kind="static",
                    anchor_bytes=6 * MiB)  # fmt: skip
PLAN: Plan = decision("full", "malloc+0 1,000/s x 1.0 µs = 0.10% <= budget 2%", estimated_percent=0.1,
                      call_rate=1000.0, allocator="glibc")  # fmt: skip
OOM = OomEvent(when=T0 + 5, victim_pid=PID, victim_comm="orderd", trigger_pid=PID, trigger_comm="orderd")
JAVA_FRAMES = [
    JavaFrame(method="OrderService.processBatch(int)", line=10),
    JavaFrame(method="OrderService.main(String[])", line=30),
]
HELD = Held(
    cls="byte[]",
    site="OrderService.processBatch(int) line: 10",
    anchor="OrderService.retryQueue",
    frames=JAVA_FRAMES,
    chain=["java.lang.Object[] [421]", "java.util.ArrayList.elementData", "OrderService.retryQueue"],
    holder_detail="Size: 3037",
    samples=84,
    share=99.0,
    oldest_age_s=18.0,
    span_percent=97.0,
    size_first=2004,
    size_last=3037,
)
JFR = JfrResult(
    name="jfr",
    status="ok",
    method="JFR through the attach socket",
    duration_s=18.3,
    recorded_s=18.0,
    held=[HELD],
    allocating=[Allocating(cls="byte[]", site=HELD.site, frames=JAVA_FRAMES, bytes=490 * MiB, samples=497)],
    old_samples=85,
    alloc_samples=497,
    alloc_bytes=490 * MiB,
    cold_start=True,
    start_cpu_s=0.7,
    record_cpu_s=0.01,
    stop_cpu_s=0.02,
    stop_pause_s=0.015,
    measured_ns=0.8e9,
    process_ns=0.8e9,
    cutoff_ms=1000,
    tool="jfr",
    listener_started=True,
    started_at=T0,
    looked_at=T0 + 8,
    looked=True,
    stopped_at=T0 + 18,
    look_pause_s=0.012,
)
HISTOGRAM = HistogramResult(
    name="histogram", status="ok", method="jcmd GC.class_histogram, twice", duration_s=27.0, build="17.0.15",
    looked_at=[T0, T0 + 26], live_first=60 * MiB, live_last=112 * MiB, pauses_s=[0.031, 0.044],
    look_cpu_s=[0.05, 0.07], measured_ns=0.13e9, process_ns=0.13e9, heap_used=180 * MiB,
    classes=[ClassGrowth(cls="byte[]", instances_first=3700, instances_last=6950, bytes_first=58 * MiB,
                         bytes_last=109 * MiB)],
)  # fmt: skip
OVER = "its price is over the budget (the trail says by how much): a larger --budget or a longer --duration pays for it"
REFUSED = "the JVM runs with -XX:+DisableAttachMechanism: it accepts no attach (its counters are still read)"

GO_FRAMES = ["main.rememberFailure (main.go:21, inlined) [orderd]", "main.main (main.go:63) [orderd]"]
GOHEAP = GoHeapResult(
    status="ok", version="go1.19.8", found_by="its symbol table", stripped=False, profile="on", rate=512 << 10,
    times=[0, 3, 6, 9, 12], cycles=[10, 11, 12, 13, 14], heap_inuse=[i * 8 * MiB + 20 * MiB for i in range(5)],
    stacks=[GoStack(frames=GO_FRAMES, functions=["main.rememberFailure", "main.main"],
                    inuse_bytes=[i * 8 * MiB + 12 * MiB for i in range(5)], inuse_objects=2816,
                    alloc_bytes=44 * MiB)],
    read_times=[0, 3, 6, 9, 12], goroutines=[3, 40, 80, 120, 160], goroutines_total=[10, 47, 87, 127, 167],
    groups=[GoroutineGroup(function="main.serve.func1", created_by="main.serve (main.go:27)", wait="chan receive",
                           waiting_in="main.awaitReply (main.go:20)", counts=[0, 37, 77, 117, 157])],
    pacer_times=[0, 3, 6, 9, 12], gogc=100, heap_goal=[80 * MiB] * 5,
    heap_marked=[i * 8 * MiB + 20 * MiB for i in range(5)],
    heap_retained=[60 * MiB] * 5, runtime_mapped=[70 * MiB] * 5, rss_anon=[68 * MiB] * 5,
    read_bytes=9 * MiB, read_seconds=0.006, module="orderd", duration_s=12.0,
)  # fmt: skip
SITES = SitesResult(
    status="ok", function="grow_orders", module="/usr/bin/orderd", sites=1, single_stepped=1, calls=7000,
    live_count=1536, live_bytes=24 * MiB, freed_count=5464, duration_s=8.0, rss_growth=30 * MiB, trap_ns=2400.0,
    stacks=[SiteStack(**_growth(1536, 24 * MiB), calls=7000, reach=LEAKED)], folded=["main;grow_orders 25165824"],
    reach_scan=SCANNED, tracing_cost=TracingCost(attached_s=8.0, probes_ns=16.8e6, cpu_ns=15.0e6, measured_ns=16.8e6),
)  # fmt: skip
UNSUPPORTED_GO = "unsupported Go version go1.22.3 (memdiag reads the runtime of go1.19)"
NODEHEAP = NodeHeapResult(
    status="ok", version="20.20.2", times=[0, 2, 4, 6], v8_mapped=[6 * MiB] * 4, v8_resident=[4 * MiB] * 4,
    native_resident=[30 * MiB, 34 * MiB, 38 * MiB, 42 * MiB], jit_resident=[256 << 10] * 4,
    perf_map="/tmp/perf-500.map", perf_map_bytes=120_000, read_seconds=0.02, duration_s=6.0,
)  # fmt: skip

PRICED_OUT = "the host's syscalls ... = 3.10% of one CPU while attached ... > budget 2%: not attached"
FD_PLAN = wide_decision(FD_PRICING, "full", "the host's syscalls ... <= budget 2%", 0.4)
FD_OVER = wide_decision(FD_PRICING, "over-budget", PRICED_OUT, 2.6)
KMEM_PLAN = wide_decision(KMEM_PRICING, "full", "the host's slab allocations and frees ... <= budget 2%", 0.3)
KMEM_OVER = wide_decision(KMEM_PRICING, "over-budget", PRICED_OUT, 2.4)
SHM_PLAN = wide_decision(SHM_PRICING, "full", "the host's syscalls ... <= budget 2%", 0.2)
SHM_OVER = wide_decision(SHM_PRICING, "over-budget", PRICED_OUT, 2.2)

# (result, plan) examples of every probe: together they yield every fact the probe declares.
EXAMPLES: dict[str, list[tuple[ProbeResult, Plan | None]]] = {
    "faults": [(FaultsResult(name="faults", status="ok", stacks=[StackGrowth(**_growth(989, 989 * 4096))],
                             folded=["main;grow_orders;malloc 989"]), None)],
    "memleak": [
        (_memleak(SCANNED, LEAKED), PLAN),
        (_memleak(ReachScan(status="skipped", reason="over budget"), None), None),
    ],
    "brkstack": [(BrkResult(name="brkstack", status="ok", calls=12, heap_growth=3 * MiB,
                            stacks=[StackGrowth(**_growth(12, 3 * MiB))], folded=["main;grow_orders 12"]), None)],
    "mmapsnoop": [(MmapResult(name="mmapsnoop", status="ok", mapped_bytes=8 * MiB,
                              stacks=[MapStack(kind="anon private rw", **_growth(2, 8 * MiB))]), None)],
    "fdstack": [(FdResult(name="fdstack", status="ok", duration_s=5.0, created=1240, closed=1140, outstanding=100,
                          by_kind=[FdTotal(kind="socketpair", created=496, closed=396, outstanding=100)],
                          stacks=[FdStack(kind="socketpair", created=100, closed=0, outstanding=100, oldest_age_s=4.9,
                                          **_growth(100, 0))],
                          folded=["main;grow_orders;socketpair 100"]), FD_PLAN),
                (FdResult(name="fdstack", status="unavailable", reason=PRICED_OUT), FD_OVER)],
    "shmwriter": [(WriterResult(name="shmwriter", status="ok", duration_s=8.0, created=400, removed=200,
                                remaining=200, remaining_bytes=200 * 65536, pattern="/dev/shm/job-*.spool",
                                places=[Place(where="/dev/shm/job-*.spool", kind="file", mount="/dev/shm",
                                              remaining=200, bytes=200 * 65536, there=262, pid=PID, comm="orderd",
                                              frames=_growth(1, 0)["frames"], stack_remaining=200)],
                                stacks=[WriterStack(kind="file", comm="orderd", created=400, removed=200,
                                                    remaining=200, where="/dev/shm/job-*.spool",
                                                    **_growth(200, 200 * 65536)),
                                        WriterStack(kind="memfd", comm="orderd", created=40, removed=0,
                                                    remaining=20, where="memfd:frame-*", **_growth(20, 20 * 65536)),
                                        WriterStack(kind="sysv", comm="orderd", created=40, removed=0,
                                                    remaining=20, where="System V IPC_PRIVATE",
                                                    **_growth(20, 20 * 65536))],
                                folded=["main;grow_orders;open64 200"]), SHM_PLAN),
                   (WriterResult(name="shmwriter", status="ok", duration_s=8.0, pattern="/dev/shm/x-*"), None),
                   (WriterResult(name="shmwriter", status="unavailable", reason=PRICED_OUT), SHM_OVER)],
    "kmemstack": [(KmemResult(name="kmemstack", status="ok", duration_s=5.0, allocs=19800, frees=9800,
                              outstanding=10000, outstanding_bytes=1920000,
                              by_cache=[CacheTotal(cache="dentry", allocs=10000, frees=0, outstanding=10000,
                                                   outstanding_bytes=1920000)],
                              stacks=[KmemStack(kernel_frames=KERNEL_FRAMES, kernel_functions=KERNEL_FUNCTIONS,
                                                cache="dentry", allocs=10000, frees=0, alloc_bytes=1920000,
                                                accounted=10000, **_growth(10000, 1920000))],
                              folded=["main;grow_orders;malloc;d_alloc_parallel;__d_alloc 1920000"]), KMEM_PLAN),
                  (KmemResult(name="kmemstack", status="unavailable", reason=PRICED_OUT), KMEM_OVER)],
    "oomkill": [(OomKillResult(name="oomkill", status="ok", kills=[OOM]), None)],
    "swapin": [(SwapinResult(name="swapin", status="ok", duration_s=4.0,
                             processes=[ProcessSwapins(pid=PID, comm="orderd", swapins=640)]), None)],
    "vmscan": [(VmscanResult(name="vmscan", status="ok", kswapd_wakeups=3, reclaim=[
        ReclaimLatency(kind="direct", events=5, total_ms=12.5, pages_reclaimed=900, histogram_us={"8-15": 5})]), None)],
    "goheap": [(GOHEAP, None), (GoHeapResult(status="unavailable", reason=UNSUPPORTED_GO), None)],
    "nodeheap": [(NODEHEAP, None)],
    "sites": [(SITES, None), (SitesResult(status="unavailable", reason="no function to trace"), None)],
    "jfr": [
        (JFR, JfrPlan(go=True, state="full", reason="priced", facts={"jfr.plan": "full"})),
        (JfrResult(name="jfr", status="unavailable", reason=REFUSED),
         JfrPlan(go=False, state="refused", reason=REFUSED, facts={"jfr.plan": "refused", "jfr.not_run": REFUSED})),
        (JfrResult(name="jfr", status="unavailable", reason="priced over"),
         JfrPlan(go=False, state="over-budget", reason="priced over",
                  facts=jfr_over_budget("`memdiag --pid 7 --budget 6`"))),
    ],
    "histogram": [
        (HISTOGRAM, HistogramPlan(go=True, state="full", reason="priced", facts={"histogram.plan": "full"})),
        (HistogramResult(name="histogram", status="unavailable", reason=OVER),
         HistogramPlan(go=False, state="over-budget", reason=OVER,
                       facts={"histogram.plan": "over-budget", "histogram.not_run": OVER})),
    ],
    "drsnoop": [(DrsnoopResult(name="drsnoop", status="ok", processes=[
        ProcessReclaim(pid=PID, comm="orderd", count=5, memcg_count=0, total_ms=150.0, max_ms=40.0,
                       pages_reclaimed=900)]), None)],
}  # fmt: skip


def observation(seconds: int = 20) -> Observation:
    """A process whose RSS climbs 4 MiB a second, one sample a second."""

    def proc(t: int) -> ProcessMemory:
        return ProcessMemory(pid=PID, comm="orderd", cmdline=["orderd"], rss=100 * MiB + 4 * MiB * t, start_ticks=1)

    snaps = [
        Snapshot(t=float(t), wall=T0 + t, meminfo=MemInfo(mem_total=8 * GiB, mem_available=6 * GiB),
                 vmstat=VmStat(counters={"pgmajfault": 0}), process=proc(t))
        for t in range(seconds)
    ]  # fmt: skip
    return Observation(
        target=Target(kind="pid", pid=PID, comm="orderd", cmdline=["orderd"], start_ticks=1), requested_s=seconds,
        started=T0, ended=T0 + seconds - 1, snapshots=snaps, oom_kills=[], processes_first={PID: proc(0)},
        processes_last={PID: proc(seconds - 1)}, memdiag_pid=4000,
    )  # fmt: skip


def engine_result(results: dict[str, ProbeResult], plans: dict[str, Plan], rules=None) -> EngineResult:
    """What the engine would return for this window and these probes: the real fact set, rules and verdict."""
    obs, classes = observation(), default_classes()
    rules = rules if rules is not None else load_rules()
    facts, counters, tri = window_facts(obs, obs.target, 2.0, None, {}, results, plans, classes)
    outcomes = run_rules(rules, facts)
    c, verdict = verdict_of(outcomes, facts, obs.target, tri, results, classes)
    return EngineResult(
        observation=obs, counters=counters, triage=tri, facts=facts, verdict=verdict, findings=c.findings,
        finding_keys=c.finding_keys, advice=c.advice, results=results, plans=plans, trail=[], classes=classes,
    )  # fmt: skip


def test_every_probe_has_an_example():
    assert set(EXAMPLES) == set(REGISTRY.names), "a probe of the registry without an example here (EXAMPLES)"
    for name, examples in EXAMPLES.items():
        for result, _plan in examples:
            assert isinstance(result, REGISTRY.face(name).result), (name, type(result))


@pytest.mark.parametrize("name", REGISTRY.names)
def test_a_probe_yields_exactly_the_facts_it_declares(name):
    face = REGISTRY.face(name)
    name_of = lambda frames, forwards: default_classes().name(frames, forwards or None).label  # noqa: E731
    produced: set[str] = set(face.facts_of(None, None, name_of))  # not run: only what stands without a run
    for result, plan in EXAMPLES[name]:
        produced |= set(face.facts_of(result, plan, name_of))
    assert produced == face.fact_names(), (produced - face.fact_names(), face.fact_names() - produced)
    known = catalog()
    for fact in face.facts:
        assert known[fact.name] == fact, fact.name  # the catalog's entry is the face's own
        assert fact.row is None or fact.row in _rows(name), (fact.name, fact.row)


def _rows(name: str) -> set[str]:
    """The rows of the probe table a probe shows, over its examples."""
    face = REGISTRY.face(name)
    return {row.name for result, plan in EXAMPLES[name] for row in face.table(result, plan, 30.0, {}, "")}


def _counter_facts() -> set[str]:
    return set(catalog()) - {f.name for f in REGISTRY.fact_defs()}


def test_every_counter_fact_of_the_catalog_has_a_producer():
    """The catalog's own facts (the counters') are each set by name in diagnose/: no entry nobody computes.
    The ledgers' facts are named from their lines' table (system/ledger.py LINES), so they are proved
    produced by computing them (tests/unit/test_ledger.py)."""
    literals: set[str] = set()
    for path in (ROOT / "diagnose").rglob("*.py"):
        nodes = ast.walk(ast.parse(path.read_text()))
        literals |= {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not _counter_facts() - literals - {name for name, _k, _h in ledger_fact_defs()}


def test_every_fact_the_diagnosis_produces_is_in_the_catalog():
    results = {name: examples[0][0] for name, examples in EXAMPLES.items()}
    result = engine_result(results, {"memleak": PLAN})
    assert not set(result.facts) - set(catalog())
    for target in (Target(kind="system"), Target(kind="pid", pid=PID, comm="orderd")):
        obs = observation().model_copy(update={"target": target})
        facts, _c, _t = window_facts(obs, target, 2.0, None, {}, {}, {}, default_classes())
        assert not set(facts) - set(catalog()), target.kind


@pytest.mark.parametrize("name", REGISTRY.names)
def test_a_probes_rows_stacks_and_sections_render_in_markdown_json_and_html(name):
    face = REGISTRY.face(name)
    for result, plan in EXAMPLES[name]:
        report = assemble(engine_result({name: result}, {name: plan} if plan else {}), 2.0)
        files = render_all(report)
        md, html, data = files["report.md"], files["report.html"], json.loads(files["report.json"])
        rows = face.table(result, plan, 30.0, {}, "")
        assert rows, name
        for row in rows:
            assert f"| {row.name} | {row.status} |" in md and f"<td>{row.name}</td>" in html, row.name
            assert row.name in [p["name"] for p in data["probes"]], row.name
        stacks = face.stacks.of(result) if face.stacks is not None else []
        for s in stacks[: face.stacks.shown if face.stacks else 0]:
            assert f"({name}: {s.detail})" in md and s.detail in html, s.detail
            assert f"`{s.frames[1]}`" in md and f"<code>{s.frames[1]}</code>" in html
            assert any(st["probe"] == name and st["frames"] == s.frames for st in data["stacks"])
        for sec in face.sections(result):
            assert f"### {sec.title}" in md and f">{sec.title}</h3>" in html
            assert sec.model_dump() in data["sections"]
        for caveat in face.caveats(result):
            assert caveat[:40] in md and caveat in data["caveats"]


# --- a probe of a new kind, added as one module plus one registry entry --------------------------

FAKE_MODULE = '''
"""A probe that reads a runtime's own counter: no BPF, a fact, a section of its own and a stack
whose frames are the runtime's language."""

from memdiag.probes.face import Face, FactDef, ProbeResult, Section, Stack, Stacks


class HeapResult(ProbeResult):
    in_use: int = 0
    frames: list[str] = []


def run(target, ctx):
    frames = ["OrderService.retry(Order) line: 17", "OrderService.processBatch(int) line: 42"]
    return HeapResult(name="fakeheap", status="ok", method="the runtime's own counters", target=target.describe(),
                      duration_s=ctx.seconds, in_use=48 << 20, frames=frames)


def facts_of(r, plan, name):
    return {} if r is None else {"fakeheap.in_use": r.in_use, "fakeheap.holder": name(r.frames, [])}


def stacks(r):
    return [Stack(frames=r.frames, bytes=r.in_use, count=1, detail="live after the last GC")]


FACE = Face(
    name="fakeheap", run=run, result=HeapResult,
    facts=(FactDef("fakeheap.in_use", "bytes", "the runtime's heap in use after its last collection"),
           FactDef("fakeheap.holder", "string", "the frame that holds most of it")),
    facts_of=facts_of,
    stacks=Stacks(kind="allocations", shown=5, of=stacks, folded=lambda r: []),
    sections=lambda r: [Section(probe="fakeheap", title="Runtime heap", lines=[f"{r.in_use >> 20} MiB in use"],
                                header=["space", "used"], rows=[["old", f"{r.in_use >> 20} MiB"]])],
)
'''

FAKE_RULES = """
rules:
  - id: ask-fakeheap
    description: a process whose memory climbs, so read its runtime's heap
    when: process.rss_shape == climbing
    then:
      probes: [{name: fakeheap, duration: 4s}]
  - id: runtime-heap-grows
    description: the runtime's own heap holds the growth
    when: fakeheap.in_use > 32MiB
    then:
      finding: "the runtime's heap holds {fakeheap.in_use}"
      verdict:
        kind: growth
        summary: "{target.name}: the runtime's heap holds {fakeheap.in_use}, most from {fakeheap.holder}"
        confidence: 0.8
        priority: 99
"""

# In a fresh interpreter: the probe's module on the path and its one registry entry, added before
# anything reads the registry; then the engine's rounds as the real engine runs them (the fake
# probe's run needs no root), the verdict, and the report.
FAKE_RUN = """
import json, sys
sys.path[:0] = [{folder!r}, {tests!r}]
from memdiag.probes import registry
registry.REGISTRY.probes += (registry.ProbeSpec("fakeheap", module="fakeheap", bpf=False),)
from pathlib import Path
from memdiag.diagnose.assemble import assemble
from memdiag.diagnose.engine import Engine
from memdiag.diagnose.render import render_all
from memdiag.rules.loader import load_playbooks, shipped_playbooks
from test_conformance import observation

rules = load_playbooks(shipped_playbooks() + [Path({rules!r})], trusted=False)
obs = observation()
clock = iter(range(1000, 2000, 1))
engine = Engine(rules, obs.target, 30.0, 2.0, clock=lambda: float(next(clock)))
facts, _c, _t = engine.facts_of(obs)
engine.run_requests([r for r in engine.evaluate(facts) if r[0] == "fakeheap"])
report = assemble(engine.finish(obs, False), 2.0)
files = render_all(report)
seen = {{"report": json.loads(files["report.json"]), "md": files["report.md"], "html": files["report.html"]}}
print(json.dumps(seen))
"""


def test_a_probe_added_as_one_module_and_one_registry_entry_drives_a_verdict(tmp_path):
    (tmp_path / "fakeheap.py").write_text(FAKE_MODULE)
    rules = tmp_path / "fake.yaml"
    rules.write_text(FAKE_RULES)
    code = FAKE_RUN.format(folder=str(tmp_path), tests=str(Path(__file__).parent), rules=str(rules))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    rep, md, html = seen["report"], seen["md"], seen["html"]
    v = rep["verdict"]
    assert (v["kind"], v["rule"]) == ("growth", "runtime-heap-grows"), v
    assert (
        v["summary"]
        == "PID 500 (orderd): the runtime's heap holds 48.0 MiB, most from OrderService.retry(Order) line: 17"
    )
    # its stack is the verdict's, named in its own language (an allocation stack: before any event stack)
    assert v["culprit"]["stack"][0] == "OrderService.retry(Order) line: 17"
    assert v["culprit"]["function"] == "OrderService.retry(Order) line: 17"
    row = next(p for p in rep["probes"] if p["name"] == "fakeheap")
    assert row["status"] == "ok" and row["figures"] == {"fakeheap.in_use": 48 << 20}
    assert "### Runtime heap" in md and '<h3 id="runtime-heap">Runtime heap</h3>' in html and "| old | 48 MiB |" in md
    assert any(t["name"] == "fakeheap" and t["kind"] == "probe" for t in rep["trail"])
    assert "`fakeheap.in_use` | 48.0 MiB" in md


def test_each_probes_row_carries_what_readers_of_a_stored_report_need():
    """A report's probe rows say what its renderers and `memdiag verify` would otherwise ask the live
    registry: whether the probe loads BPF (its cost is memdiag's reads), whether its program runs
    host-wide, and what its stacks are (verify compares the allocation stacks of two reports)."""
    results = {name: examples[0][0] for name, examples in EXAMPLES.items()}
    rep = assemble(engine_result(results, {"memleak": PLAN}), 2.0)
    rows = {name: next(p for p in rep.probes if p.name == name) for name in REGISTRY.names}
    said = {name: (r.reads, r.host_wide, r.stacks) for name, r in rows.items()}
    assert said["memleak"] == (False, False, "allocations") and said["faults"] == (False, False, "events")
    assert said["brkstack"] == (False, True, "events") and said["jfr"][0] and said["goheap"][0]
    for name in REGISTRY.names:
        face, spec = REGISTRY.face(name), REGISTRY.spec(name)
        assert said[name] == (not spec.bpf, spec.host_wide, face.stacks.kind if face.stacks else None), name
