"""A JVM target's facts from its own counters over a window (fixture snapshots in the counters'
own terms), the tables the report shows them in, the shipped playbook's verdicts on them, and
the flight recorder's face: only declared facts, its rows, stacks and sections, and its plan."""

from __future__ import annotations

import json

import pytest
from memdiag.diagnose.evidence import build_counters
from memdiag.diagnose.observe import Observation
from memdiag.diagnose.render.markdown import render_markdown
from memdiag.diagnose.report import Counters
from memdiag.diagnose.snapshot import Snapshot
from memdiag.diagnose.workflow import load_rules
from memdiag.probes.face import Budget, Context, ProbeStatus, RowContext
from memdiag.probes.jvm import RUNTIME
from memdiag.probes.jvm import plan as jplan
from memdiag.probes.jvm.attach import Jvm
from memdiag.probes.jvm.costs import Price
from memdiag.probes.jvm.counters import live_points
from memdiag.probes.jvm.probe import JfrResult
from memdiag.probes.jvm.recording import held, parse_recording, parse_time
from memdiag.probes.jvm.tool import Tool
from memdiag.probes.jvm.view import FACE
from memdiag.rules.engine import conclude, run_rules
from memdiag.system.jvm import JvmCounters, JvmMemory, JvmSample
from memdiag.system.meminfo import MemInfo
from memdiag.system.process import ProcessMemory
from memdiag.system.target import Target
from memdiag.system.vmstat import VmStat
from test_jfr_recording import T0, recording_json
from test_render import fixture_report

MiB, GiB = 1 << 20, 1 << 30


def sample(
    t: int, after_gc: int, gcs: int, heap_rss: int, rss: int, gc_time: float = 0.0, remarks: int = 0
) -> JvmSample:
    """remarks: pauses of G1's concurrent cycle among the collections counted, which move nothing."""
    c = JvmCounters(clock_s=float(t), policy="GarbageFirst", heap_used=after_gc + 8 * MiB, heap_committed=400 * MiB,
                    heap_max=GiB, after_gc_used=after_gc, gc_count=gcs + remarks, evacuations=gcs,
                    gc_time_s=gc_time, metaspace_committed=8 * MiB,
                    vm="OpenJDK 64-Bit Server VM", version="17.0.15")  # fmt: skip
    m = JvmMemory(rss=rss, heap=heap_rss, code=2 * MiB, stacks=MiB, metaspace=8 * MiB, files=30 * MiB,
                  other=rss - heap_rss - 41 * MiB)  # fmt: skip
    return JvmSample(counters=c, memory=m)


def observation(samples: list[JvmSample]) -> Observation:
    snaps = [
        Snapshot(t=float(t), wall=1.8e9 + t, meminfo=MemInfo(mem_total=8 * GiB, mem_available=6 * GiB),
                 vmstat=VmStat(counters={}), runtime=j,
                 process=ProcessMemory(pid=7, comm="java", cmdline=["java"], rss=j.memory.rss if j.memory else None))
        for t, j in enumerate(samples)
    ]  # fmt: skip
    return Observation(target=Target.for_pid(7, "java"), runtime="jvm", requested_s=30, started=1.8e9,
                       ended=1.8e9 + len(snaps), snapshots=snaps)  # fmt: skip


def jvm_facts(obs: Observation) -> dict:
    """What the JVM's runtime face says of the window, as the diagnosis asks it."""
    return RUNTIME.facts_of(obs.runtime_samples(), 7)


def jvm_rows(obs: Observation):
    return RUNTIME.rows(obs.runtime_samples())


def jvm_sections(obs: Observation):
    return RUNTIME.sections(obs.runtime_samples())


def jvm_series(obs: Observation):
    return RUNTIME.series(obs.runtime_samples(), obs.snapshots[0].t)


def leaking() -> Observation:
    """A collection every 3 s; what it leaves climbs 6 MiB a time; the heap holds the RSS growth."""
    return observation(
        [sample(t, 20 * MiB + (t // 3) * 6 * MiB, t // 3, 50 * MiB + t * 2 * MiB, 90 * MiB + t * 2 * MiB)
         for t in range(31)]
    )  # fmt: skip


def test_a_remark_pause_after_the_last_collection_is_no_level():
    """The e2e failure: a collection every 3 s, then at 27 s a pause of G1's concurrent cycle (a
    remark) that moves nothing: what the heap holds repeats the last collection's to the byte. It
    is no point of the live set, which climbs."""
    obs = observation(
        [sample(t, 20 * MiB + (min(t, 26) // 3) * 6 * MiB, min(t, 26) // 3, 50 * MiB + t * 2 * MiB,
                90 * MiB + t * 2 * MiB, remarks=int(t >= 27))
         for t in range(31)]
    )  # fmt: skip
    points = live_points([(s.t, s.runtime.counters) for s in obs.snapshots])
    assert [t for t, _ in points] == [3, 6, 9, 12, 15, 18, 21, 24]
    f = jvm_facts(obs)
    assert f["jvm.live_set_shape"] == "climbing" and f["jvm.gc_count"] == 9


def test_the_live_set_is_one_point_per_collection_and_the_heap_holds_the_growth():
    obs = leaking()
    points = live_points([(s.t, s.runtime.counters) for s in obs.snapshots])
    assert len(points) == 10  # the samples right after each collection, not the repeats between them
    f = jvm_facts(obs)
    assert f["jvm.live_set_shape"] == "climbing" and f["jvm.live_set"] == 80 * MiB
    assert f["jvm.heap_growth_share"] == pytest.approx(100.0)
    assert f["jvm.gc_count"] == 10 and f["jvm.live_set_percent"] == pytest.approx(100 * 80 / 1024)
    assert jvm_series(obs)["jvm.live_set"][0] == (3.0, 26 * MiB)
    rows = {r.name: r for r in jvm_rows(obs)}
    assert rows["heap_max"].last == GiB and rows["heap_rss"].last - rows["heap_rss"].first == 60 * MiB
    counters = build_counters(obs)
    assert counters.trends["jvm.live_set"].shape == "climbing"  # the Trends table's, the fact's
    assert counters.trends["jvm.live_set"].rate_per_s == pytest.approx(f["jvm.live_set_rate"])
    (sec,) = jvm_sections(obs)
    assert sec.title == "Java heap: where the RSS is" and sec.rows[0][:1] == ["Java heap"]


def test_a_report_json_of_the_release_before_runtime_faces_still_loads():
    """Its JVM counters were scoped `jvm` and its series unlabelled: read as the runtime's, as
    `memdiag verify` reads an earlier run's report; rendered as they were."""
    counters = build_counters(leaking())
    assert counters.runtime == "JVM" and {r.scope for r in counters.rows} >= {"runtime"}
    old = json.loads(counters.model_dump_json())
    del old["runtime"], old["labels"]
    old["rows"] = [{**r, "scope": "jvm"} if r["scope"] == "runtime" else r for r in old["rows"]]
    assert Counters.model_validate(old) == counters
    report = fixture_report()
    md = render_markdown(report.model_copy(update={"counters": Counters.model_validate(old)}))
    assert "### JVM counters" in md and "| JVM live set (after collections) |" in md
    assert "| Java heap maximum (-Xmx) |" in md


def verdict(facts: dict) -> str:
    c = conclude(run_rules(load_rules(), facts), facts)
    return c.winner.id if c.winner else ""


BASE = {"target.kind": "pid", "target.name": "PID 7 (java)", "target.runtime": "jvm", "window.samples": 31,
        "process.rss_shape": "climbing", "process.rss_growth": 60 * MiB, "oom.kills": 0, "oom.kills_in_window": 0,
        "memory.shape": "climbing", "summary.growth": "g"}  # fmt: skip


def test_playbook_java_verdicts_from_the_counters_and_the_recording():
    counters = {**BASE, **jvm_facts(leaking())}
    assert verdict(counters) == "java-heap-growth-unnamed"  # the recording did not run
    named = {**counters, "jfr.held_anchor": "OrderService.retryQueue", "jfr.held_kept": 100.0}
    assert verdict(named) == "java-heap-retained"
    assert verdict({**named, "jfr.held_kept": 2.0}) == "java-heap-turnover"
    # the holder's size at the two looks decides over what its sampled objects did
    assert verdict({**named, "jfr.held_grew": False, "jfr.held_change": "4,000 entries at both looks"}) == (
        "java-heap-turnover"
    )
    assert verdict({**named, "jfr.held_kept": 2.0, "jfr.held_grew": True}) == "java-heap-retained"
    near = {**named, "jvm.live_set_percent": 93.0, "jvm.gc_share": 35.0, "jvm.gc_share_recent": 40.0}
    assert verdict(near) == "java-heap-pressure"
    native = {**BASE, "jvm.heap_growth_share": 2.0, "jvm.live_set_shape": "flat", "reach.leaked_count": 3000,
              "reach.leaked_ratio": 100.0}  # fmt: skip
    assert verdict(native) == "leak-unreachable"  # growth outside the heap: the malloc probes' verdict
    # memleak's finding in the JVM's own code does not name growth the heap holds
    malloc_cache = {**counters, "reach.anchored_ratio": 100.0, "memleak.top_trend": "flat", "reach.scanned": True}
    assert verdict(malloc_cache) == "java-heap-growth-unnamed"


def test_a_recording_whose_samples_in_the_heap_are_all_garbage_says_turnover_not_growth():
    """The fresh-clone failure of the LRU cache: its live set after collections climbed, and all 184
    samples the recording found still in the heap were reached from no root."""
    counters = {**BASE, **jvm_facts(leaking())}
    recorded = {**counters, "jfr.recorded": 18.4, "jfr.alloc_class": "byte[]", "jfr.alloc_rate": 6e6,
                "jfr.alloc_site": "LruCache.load(int) line: 27"}  # fmt: skip
    c = conclude(run_rules(load_rules(), {**recorded, "jfr.unrooted": 184}), {**recorded, "jfr.unrooted": 184})
    assert c.winner.id == "java-heap-sampled-garbage" and c.winner.then.verdict.kind == "cache"
    assert "all 184 objects the flight recorder sampled and found still in the heap are reached from no root" in (
        c.summary
    )
    assert "byte[] allocated at LruCache.load(int) line: 27" in c.summary
    # too few samples to say, a sample that is held, or pressure: not this rule
    assert verdict({**recorded, "jfr.unrooted": 5}) == "java-heap-growth-unnamed"
    assert verdict({**recorded, "jfr.unrooted": 184, "jfr.held_anchor": "LruCache.cache"}) != (
        "java-heap-sampled-garbage"
    )
    near = {**recorded, "jfr.unrooted": 184, "jvm.live_set_percent": 93.0, "jvm.gc_share": 35.0,
            "jvm.gc_share_recent": 40.0}  # fmt: skip
    assert verdict(near) == "java-heap-pressure"


def test_rss_climbing_asks_malloc_probes_only_where_the_heap_does_not_hold_the_growth():
    rules = {r.id: r for r in load_rules()}
    fired = {r.id for r, o in run_rules(list(rules.values()), {**BASE, **jvm_facts(leaking())}) if o.state == "fired"}
    assert "java-heap-grows" in fired and "rss-climbing" not in fired
    not_jvm = {**BASE, "target.runtime": "none"}
    fired = {r.id for r, o in run_rules(list(rules.values()), not_jvm) if o.state == "fired"}
    assert "rss-climbing" in fired and "java-heap-grows" not in fired


def jfr_result() -> JfrResult:
    parsed = parse_recording(recording_json())
    start, stop = parse_time(T0), parse_time("2026-12-01T21:54:18.000000000Z")
    return JfrResult(name="jfr", status="ok", held=held(parsed, start, stop), recorded_s=20, started_at=start,
                     stopped_at=stop, old_samples=len(parsed.old), unrooted=2, cold_start=True, start_cpu_s=0.9,
                     record_cpu_s=0.005, stop_cpu_s=0.02, stop_pause_s=0.012, measured_ns=0.95e9, process_ns=0.95e9,
                     cutoff_ms=500, tool="jfr", listener_started=True)  # fmt: skip


def test_the_recordings_face_yields_only_its_facts_and_says_what_holds_the_heap():
    r = jfr_result()
    facts = FACE.facts_of(r, None, lambda *_: None)
    assert set(facts) <= FACE.fact_names()
    assert facts["jfr.held_by"] == "OrderService.retryQueue (Size: 3037)" and facts["jfr.held_kept"] == pytest.approx(
        200 / 3
    )
    (sec, *_) = FACE.sections(r)
    assert sec.rows[0][2] == "OrderService.retryQueue" and "first start in this JVM" in sec.lines[1]
    stack = FACE.stacks.culprit_of(r, "growth")
    assert stack.frames[0] == "OrderService.processBatch(int) line: 10"
    assert FACE.stacks.culprit_of(r, "leak") is None  # a leak on a JVM is native: memleak's stack
    assert any("attach listener" in c for c in FACE.caveats(r))
    row = ProbeStatus(name="jfr", status="not-run", reason="no rule asked for it")
    assert FACE.rows(None, None, RowContext(30, {}, row)) == []  # no row for a target that is no JVM


@pytest.mark.parametrize(
    ("looked_at", "looked", "first", "last", "grew", "words"),
    [
        (8, True, 4000, 4000, False, "4,000 entries at both looks, 10 s apart"),
        (8, True, 2004, 3037, True, "3,037 entries, from 2,004 10 s earlier"),
        (8, True, None, 4000, None, "4,000 entries at the stop; none of its sampled objects were held at the first"),
        (8, False, None, 4000, None, "4,000 entries at the stop; no first look to compare (its dump failed)"),
        (None, False, None, 4000, None, "no first look to compare (the recording stopped before it)"),
        (8, True, 4000, None, None, "the JVM said no size of it at the stop"),
    ],
)
def test_the_holders_size_at_both_looks_says_which_look_had_none(looked_at, looked, first, last, grew, words):
    """Under load (CI's), the first look can find none of the holder's objects sampled yet, or not
    happen: the words say which, and growth is left unknown rather than guessed."""
    r = jfr_result()
    top = r.held[0].model_copy(update={"size_first": first, "size_last": last})
    at = r.stopped_at - 10 if looked_at else None
    r = r.model_copy(update={"held": [top], "looked_at": at, "looked": looked})
    facts = FACE.facts_of(r, None, lambda *_: None)
    assert words in facts["jfr.held_change"]
    assert facts.get("jfr.held_grew") is grew


def test_the_plan_prices_the_start_the_recording_and_the_stop_against_the_budget():
    jvm = Jvm(pid=7, nspid=7, uid=0, gid=0, start_ticks=1, proc=__import__("pathlib").Path("/proc/7"))
    cold = Price(start_s=1.31, record_per_s=0.0065, stop_s=0.09, measured_here=False)

    def planned(percent: float, seconds: float = 20, share: float = 1.0):
        ctx = Context(seconds=seconds, budget=Budget(percent, 30), max_pause_ms=1000)
        how = (share, f"{share:.0%} of it")
        return jplan._priced(ctx, jvm, Tool("/usr/lib/jvm/x/bin/jfr", 17, "jfr"), "17", True, cold, how)

    # where the JVM kept every CPU busy before, the application pays all of the JVM's CPU for it
    over = planned(2)  # 600 ms of a 30 s window: a cold start does not fit
    assert not over.go and over.state == "over-budget" and "--budget" in over.facts["jfr.not_run"]
    # start, 20 s recording, the stop and the first look (a dump, priced as a stop), and the pauses
    # of the start, the look and the stop (the priors: 20 + 2 x 10 ms)
    cpu = 1.31 + 0.0065 * 20 + 2 * 0.09
    assert over.estimated_percent == pytest.approx(100 * (cpu + 0.04) / 30)
    assert "of the JVM's CPU for it, 1620 ms" in over.reason and "100% of it" in over.reason
    ok = planned(10)
    assert ok.go and ok.cutoff_ms == 1000 and ok.allowance_ns == pytest.approx(3e9)
    tight = planned(5.6)  # 1.68 s allowed, 1.66 s priced: the rest is the cutoff of the paths' search
    assert tight.go and 10 <= tight.cutoff_ms < 40
    assert not planned(5.5).go  # 1.65 s allowed: no 10 ms left to search the paths: no holder to name
    # a JVM that kept 1% of the CPUs busy: its compiler threads take turns nobody else wanted, and the
    # application pays 1% of the JVM's CPU and every pause; at 2% it goes, the CPU still said
    idle = planned(2, share=0.01)
    assert idle.go and idle.estimated_percent == pytest.approx(100 * (cpu * 0.01 + 0.04) / 30)
    assert idle.share == 0.01 and "1620 ms" in idle.reason
    # over the budget, the exact command that pays: 1.66 s and the 10 ms search need 6% of 30 s; at 2%,
    # each second of window leaves 20 - 6.5 ms, so the 1.54 s paid once need 114 s: 120 s
    assert over.facts["jfr.pays"] == "`memdiag --pid 7 --budget 6` (or `--duration 120` at --budget 2)"
    assert over.facts["jfr.pays"] in over.facts["jfr.not_run"] and "1660 ms" in over.reason
    assert planned(6).go  # what it says pays does pay
    long = Context(seconds=120, budget=Budget(2, 120), max_pause_ms=1000)
    assert jplan._priced(long, jvm, Tool("/x/jfr", 17, "jfr"), "17", True, cold, (1.0, "all of it")).go


def test_the_share_of_the_cpus_is_the_jvms_rate_over_the_cpus_it_may_use():
    import os

    cpus = len(os.sched_getaffinity(os.getpid()))
    assert jplan.cpu_share(os.getpid(), None)[0] == 1.0  # unknown: all of it
    share, how = jplan.cpu_share(os.getpid(), cpus / 4)
    assert share == pytest.approx(0.25) and f"of its {cpus} CPUs" in how
    assert jplan.cpu_share(os.getpid(), cpus * 3)[0] == 1.0


def test_a_jvm_without_counters_says_which_flag_and_the_playbook_says_so():
    why = "the JVM runs with -XX:-UsePerfData: it keeps no performance counters"
    obs = observation([JvmSample(missing=why)] * 5)
    f = jvm_facts(obs)
    assert f == {"jvm.counters": False, "jvm.counters_missing": why}
    assert jvm_rows(obs) == [] and jvm_sections(obs)[0].lines == [f"no JVM counters: {why}"]
    fired = {r.id for r, o in run_rules(load_rules(), {**BASE, **f}) if o.state == "fired"}
    assert "java-no-counters" in fired and "rss-climbing" in fired  # malloc probes are all there is
