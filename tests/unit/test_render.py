"""Renderers on their whole output: a fixed Report, rendered, compared with the golden file.
Regenerate after an intended change with MEMDIAG_REGEN_GOLDEN=1 and review the diff."""

import json
import os
from pathlib import Path

from figures import check_figures
from memdiag.diagnose.render.jsonout import render_json
from memdiag.diagnose.render.markdown import render_markdown
from memdiag.diagnose.render.sparkline import sparkline
from memdiag.diagnose.report import (
    CounterRow,
    Counters,
    Culprit,
    Finding,
    Overhead,
    ProbeStatus,
    ProcessRow,
    Report,
    SlabGrowth,
    StackReport,
    TargetInfo,
    TrailItem,
    Verdict,
    Window,
)
from memdiag.probes.memleak.reach import StackReach
from memdiag.system.kmsg import OomKill
from memdiag.system.trends import growth_trend

GOLDEN = Path(__file__).parent / "golden"
MiB = 1 << 20
T0 = 1796020000.0  # 2026-11-30 06:26:40 UTC


def fixture_report() -> Report:
    rss = [(float(t), 100 * MiB + 0.8 * MiB * t) for t in range(0, 31, 3)]
    return Report(
        memdiag_version="0.1.0",
        target=TargetInfo(
            kind="pid",
            description="PID 123 (orderd)",
            pid=123,
            comm="orderd",
            cmdline=["/usr/bin/orderd", "--port", "80"],
            cgroup="/system.slice/orderd.service",
            cgroup_version=2,
        ),
        window=Window(started=T0, ended=T0 + 30, requested_s=30, samples=31),
        verdict=Verdict(
            kind="growth",
            summary="RSS of PID 123 (orderd) grew 48.0 MiB/min over 30 s (100 MiB to 124 MiB) and is still "
            "climbing; at that rate the cgroup limit 512 MiB (388 MiB left) is reached in ~8 min (an estimate); "
            "escalation needed: page-fault stacks / memleak",
            confidence=0.7,
            culprit=Culprit(
                pid=123,
                comm="orderd",
                cgroup="/system.slice/orderd.service",
                stack=[
                    "malloc+0x0 [libc.so.6]",
                    "order_alloc+0x12 [orderd]",
                    "xmalloc+0x9 [orderd]",
                    "Orders::add(long)+0x1c [orderd]",
                    "handle(Request&)+0x40 [orderd]",
                    "serve()+0x88 [orderd]",
                    "main+0x10d [orderd]",
                    "__libc_start_call_main+0x7a [libc.so.6]",
                ],
                function="Orders::add(long)",
                frame_kinds=["allocator", "guessed-wrapper", "wrapper", "culprit", *["caller"] * 4],
                guessed=True,
            ),
        ),
        findings=[
            Finding(
                id="growth-climbing",
                summary="RSS of PID 123 (orderd) grew 48.0 MiB/min over 30 s; Orders::add holds 24.0 MiB, "
                "growing 120 MiB/min",
                evidence={"series": "process.rss"},
            )
        ],
        next_steps=["trace page faults by stack (faults probe)", "track outstanding allocations (memleak probe)"],
        caveats=["VSZ grew 1.0 GiB but RSS only 24.0 MiB: address space reserved, not memory used (VSZ is not RSS)"],
        probes=[
            ProbeStatus(name="faults", status="not-run", reason="counters-only diagnosis"),
            ProbeStatus(
                name="memleak",
                status="partial",
                reason="a table filled up: some allocations were not tracked (see lost)",
                duration_s=12.0,
                events=12288,
                lost={"table_full": 12},
                figures={"memleak.top_outstanding": 24 * MiB, "memleak.top_rate": 2 * MiB},
                on_target=True,
            ),
            ProbeStatus(
                name="swapin",
                status="unavailable",
                reason="kprobes not compiled into this kernel",
                method="major faults on anonymous memory",
            ),
        ],
        overhead=Overhead(
            budget_percent=2.0,
            estimated_percent=0.29,
            estimate_of="allocation tracing",
            measured_percent=0.61,
            tracing_probes_percent=0.58,
            tracing_cpu_percent=0.55,
            window_s=30.0,
        ),
        budget_decision="malloc+0 (emulated + return probe) 2,000/s x 1.6 µs + free+9 (emulated) 2,000/s x 619 ns "
        "= 0.44% of a CPU while attached; over the 19 s it would run and its detach, with the rate count's 1.6 ms, "
        "0.29% of the 30 s window <= budget 2%",
        trail=[
            TrailItem(
                kind="rule",
                name="rss-climbing",
                state="fired",
                reason="process.rss_shape = climbing",
                source="playbooks/default.yaml:48",
                at_s=9.0,
            ),
            TrailItem(kind="rule", name="oom-kill", state="not-fired", reason="oom.kills = 0", at_s=9.0),
            TrailItem(kind="budget", name="memleak", state="full", reason="0.50% <= budget 2%", at_s=9.5),
            TrailItem(kind="probe", name="memleak", state="ok", reason="asked by rss-climbing; ok", at_s=24.0),
            TrailItem(kind="scan", name="reach", state="ran", reason="ran 12.0 s in: paused 21.0 ms", at_s=24),
        ],
        stacks=[
            StackReport(
                probe="memleak",
                frames=["malloc+0x0 [libc.so.6]", "Orders::add(long)+0x1c [orderd]", "main+0x10d [orderd]"],
                frame_kinds=["allocator", "culprit", "caller"],
                bytes=24 * MiB,
                detail="6,144 allocations outstanding, 6,144 allocs, 0 frees",
                series=[0, 4 * MiB, 8 * MiB, 12 * MiB, 16 * MiB, 20 * MiB, 24 * MiB],
                reach=StackReach(
                    leaked_count=0,
                    leaked_bytes=0,
                    anchored_count=6144,
                    anchored_bytes=24 * MiB,
                    anchor="`orders` in orderd's .bss",
                    anchor_kind="static",
                    anchor_bytes=24 * MiB,
                ),
            )
        ],
        folded=["main;Orders::add(long);malloc 25165824"],
        counters=Counters(
            rows=[
                CounterRow(scope="process", name="rss", unit="bytes", first=100 * MiB, last=124 * MiB),
                CounterRow(scope="process", name="majflt", unit="per_s", first=3, last=9, rate_per_s=0.2),
                CounterRow(scope="cgroup", name="usage", unit="bytes", first=100 * MiB, last=124 * MiB),
                CounterRow(scope="cgroup", name="effective_limit", unit="bytes", first=512 * MiB, last=512 * MiB),
                CounterRow(scope="cgroup", name="oom_kill", unit="count", first=1, last=1),
                CounterRow(
                    scope="system", name="mem_available", unit="bytes", first=20 << 30, last=(20 << 30) - 24 * MiB
                ),
                CounterRow(scope="system", name="pswpin", unit="pages_per_s", first=0, last=0, rate_per_s=0.0),
                CounterRow(scope="system", name="psi_some_window", unit="percent", last=0.5),
            ],
            trends={"process.rss": growth_trend(rss)},
            series={"process.rss": rss},
            oom_kills=[
                OomKill(
                    when=T0 - 3600,
                    victim_pid=99,
                    victim_comm="orderd",
                    constraint="CONSTRAINT_MEMCG",
                    oom_memcg="/system.slice/orderd.service",
                    task_memcg="/system.slice/orderd.service",
                    trigger_comm="orderd",
                    trigger_pid=99,
                    anon_rss=500 * MiB,
                    file_rss=2 * MiB,
                )
            ],
            slab_top=[SlabGrowth(name="dentry", first_bytes=10 * MiB, last_bytes=11 * MiB)],
            processes=[ProcessRow(pid=123, comm="orderd", rss_first=100 * MiB, rss_last=124 * MiB, majflt_delta=6)],
            swap_devices=[],
        ),
    )


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("MEMDIAG_REGEN_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text()


def test_markdown_whole_output():
    _check("report_growth.md", render_markdown(fixture_report()))


def test_json_round_trips():
    report = fixture_report()
    assert Report.model_validate_json(render_json(report)) == report


def test_sparkline():
    assert sparkline([1, 2, 3, 4, 5, 6, 7, 8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert len(sparkline(list(range(100)), width=40)) == 40
    assert sparkline([]) == ""


def test_every_figure_of_the_fixture_is_in_its_tables():
    assert check_figures(json.loads(render_json(fixture_report()))) == []


def test_plain_text_shows_every_control_character():
    from memdiag.diagnose.render.text import json_text, plain

    hostile = "\x1b[31mRED\n# HEAD\t\x07\x7f\x9b2J\x9d0;t\x85\u2028ok é"
    shown = plain(hostile)
    assert shown == "\\x1b[31mRED\\n# HEAD\\t\\x07\\x7f\\x9b2J\\x9d0;t\\x85\\u2028ok é"
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in shown)
    assert plain(Path("/tmp/a\x1bb")) == "/tmp/a\\x1bb"
    raw = json.dumps({"comm": hostile}, ensure_ascii=False)
    safe = json_text(raw)
    assert json.loads(safe) == {"comm": hostile}  # the same value
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in safe)


def test_probe_text_shows_outside_strings_escaped():
    from memdiag.diagnose.render.probe_text import render_probe
    from memdiag.probes.faults import FaultsResult, ProcessFaults

    r = FaultsResult(
        name="faults",
        status="ok",
        reason="target \x1b]0;title\x07 gone",
        target="PID 7 (\x1b[2J)",
        per_process=[ProcessFaults(pid=7, comm="\x1b[31mRED\n# HEAD", faults=3, bytes=12288)],
    )
    text = render_probe(r)
    assert "\x1b" not in text and "\x07" not in text
    assert text.splitlines()[0] == "faults: ok (target \\x1b]0;title\\x07 gone)"
    assert "  PID       7 \\x1b[31mRED\\n# HEAD         3 faults  12.0 KiB" in text.splitlines()


def container_report() -> Report:
    """The fixture as a diagnosis of a Kubernetes container by --container: the target carries the
    container and its pod, the processes their pids inside the container."""
    from memdiag.diagnose.containers import ContainerInfo

    cid = "3f9a2c" + "7b" * 29
    cgroup = (
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1d2c3b4a_5e6f_4a8b_9c0d_1e2f3a4b5c6d.slice/"
        f"cri-containerd-{cid}.scope"
    )
    base = fixture_report()
    target = TargetInfo(
        kind="cgroup",
        description="container orderd (3f9a2c7b7b7b)",
        cgroup=cgroup,
        cgroup_version=2,
        container=ContainerInfo(
            id=cid,
            name="orderd",
            image="registry.example/shop/orderd:1.4",
            runtime="containerd",
            cgroup=cgroup,
            pod_uid="1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
            pod="orderd-5d8f7",
            namespace="shop",
            host_pid=123,
            limit_bytes=512 * MiB,
        ),
    )
    processes = [
        ProcessRow(pid=123, comm="orderd", rss_first=100 * MiB, rss_last=124 * MiB, majflt_delta=6, ns_pid=1),
        ProcessRow(pid=140, comm="sh", rss_first=1 * MiB, rss_last=1 * MiB, majflt_delta=0, ns_pid=9),
    ]
    counters = base.counters.model_copy(update={"processes": processes})
    return base.model_copy(update={"target": target, "counters": counters})


def test_markdown_of_a_container_whole_output():
    _check("report_container.md", render_markdown(container_report()))


def test_container_json_round_trips_and_its_figures_hold():
    report = container_report()
    assert Report.model_validate_json(render_json(report)) == report
    assert check_figures(json.loads(render_json(report))) == []


def test_markdown_of_a_pod_whole_output():
    """A pod named by its uid (an alert's labels): the pod's cgroup, qos and limit; no container line."""
    from memdiag.diagnose.containers import PodInfo

    base = container_report()
    pod = PodInfo(
        uid="1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
        name="orderd-5d8f7",
        namespace="shop",
        qos="burstable",
        cgroup="/kubepods/burstable/pod1d2c3b4a-5e6f-4a8b-9c0d-1e2f3a4b5c6d",
        limit_bytes=1 << 30,
        containers=[base.target.container],
    )
    target = TargetInfo(
        kind="cgroup", description="pod shop/orderd-5d8f7", cgroup=pod.cgroup, cgroup_version=1, pod=pod
    )
    _check("report_pod.md", render_markdown(base.model_copy(update={"target": target})))


def test_the_overhead_line_names_host_wide_probes_only_when_they_ran():
    from memdiag.diagnose.render.markdown import _overhead_lines
    from memdiag.diagnose.report import Overhead, ProbeStatus

    o = Overhead(budget_percent=2.0, measured_percent=0.2, window_s=30.0)
    faults = ProbeStatus(name="faults", status="ok", reason="", overhead_percent=0.1)
    brk = ProbeStatus(name="brkstack", status="ok", reason="", overhead_percent=0.1, host_wide=True)
    alone = _overhead_lines(o, [faults])[-1]
    assert alone == (
        "- faults: their BPF run time for every process they fire for: an upper bound of the target's share"
    ), alone
    both = _overhead_lines(o, [faults, brk])[-1]
    assert "faults, brkstack: " in both and "(every syscall on the host for brkstack, which filter" in both, both


def test_a_report_json_whose_probe_rows_do_not_say_how_their_cost_is_measured_still_renders_it():
    """report.json before the rows carried `reads` and `host_wide`: the registry says them on loading."""
    from memdiag.diagnose.report import Report

    report = fixture_report()
    data = json.loads(report.model_dump_json())
    rows = [{k: v for k, v in row.items() if k not in ("reads", "host_wide")} for row in data["probes"]]
    old = Report.model_validate({**data, "probes": rows + [{"name": "brkstack", "status": "not-run", "reason": ""}]})
    brk = old.probes[-1]
    assert brk.host_wide and not brk.reads
    assert [(p.reads, p.host_wide) for p in old.probes[:-1]] == [(p.reads, p.host_wide) for p in report.probes]


def test_the_targets_runtime_is_a_line_of_its_own_when_recognised():
    base = fixture_report()
    detail = "Go 1.19.8 (/usr/bin/orderd; module example.com/orderd)"
    go = base.model_copy(update={"target": base.target.model_copy(update={"runtime": "go", "runtime_detail": detail})})
    lines = render_markdown(go).splitlines()
    at = lines.index(f"- Runtime: {detail}")
    assert lines[at - 1].startswith("- Target: PID 123 (orderd)")
    assert Report.model_validate_json(render_json(go)).target.runtime_detail == detail
    native = base.model_copy(update={"target": base.target.model_copy(update={"runtime": "none"})})
    assert not any(x.startswith("- Runtime:") for x in render_markdown(native).splitlines())


def cycles_report() -> Report:
    """The fixture watched as a long window: four cycles, a leaking stack and a cache that fills."""
    from memdiag.diagnose.report import CycleRecord, CycleStack

    cycles = []
    for i in range(4):
        stacks = [CycleStack(probe="memleak", function="failed_batch", bytes=(i + 1) * MiB,
                             leaked_bytes=(i + 1) * MiB if i % 2 else 0, leaked_count=(i + 1) * 64 if i % 2 else 0),
                  CycleStack(probe="memleak", function="cache_put", bytes=min(i, 2) * 4 * MiB,
                             leaked_bytes=0, leaked_count=0)]  # fmt: skip
        cycles.append(CycleRecord(index=i, start_s=7.5 * i, end_s=7.5 * (i + 1), memory=(100 + 6 * i) * MiB,
                                  probes=["memleak"], stacks=stacks))  # fmt: skip
    report = fixture_report()
    series = {**report.counters.series, "jvm.live_set": [(float(t), 40 * MiB + MiB * t / 3) for t in range(0, 31, 6)]}
    labels = {"jvm.live_set": "JVM live set (after collections)"}  # the runtime's series, as its face names them
    counters = report.counters.model_copy(update={"series": series, "labels": labels})
    return report.model_copy(update={"cycles": cycles, "counters": counters})


def test_window_svg_whole_output():
    from memdiag.diagnose.render.window import render_window

    svg = render_window(cycles_report())
    _check("window.svg", svg)
    # the leaking stack's running total is drawn, the cache's is not (it never leaked)
    assert "failed_batch, leaked so far" in svg and "cache_put, leaked so far" not in svg


def test_window_svg_without_cycles_says_so():
    from memdiag.diagnose.render.window import render_window

    assert "no cycles recorded" in render_window(fixture_report())


def test_a_levelled_series_is_shown_without_a_rate():
    """A cache that filled and levelled off is where it levelled, not a rate: its average over the
    window (once shown as 64.8 MiB/min beside "levelled") reads as growth that is not happening."""
    base = fixture_report()
    t0 = base.counters.series["process.rss"][0][0]
    levelled = [(t0 + t, 100 * MiB + min(t, 10) * 8 * MiB) for t in range(30)]  # 80 MiB in 10 s, then flat
    trend = growth_trend(levelled)
    assert trend.shape == "levelled" and trend.rate_per_s > 0  # the window's average: true, not the story
    counters = base.counters.model_copy(update={"trends": {"process.rss": trend}, "series": {"process.rss": levelled}})
    md = render_markdown(base.model_copy(update={"counters": counters}))
    row = next(line for line in md.splitlines() if line.startswith("| process RSS |"))
    assert row.split(" | ")[1:6] == ["100 MiB", "180 MiB", "80.0 MiB", "– (levelled)", "levelled"]
    assert "MiB/min" not in row
    json_trend = json.loads(render_json(base.model_copy(update={"counters": counters})))["counters"]["trends"]
    assert json_trend["process.rss"]["rate_per_s"] == trend.rate_per_s  # the figure is kept where it is data
