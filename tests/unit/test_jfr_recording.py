"""A recording's memory events as `jfr print --json` writes them (the structure of OpenJDK 17's
output, trimmed of what memdiag does not read), read into samples; what is held, by what, and
allocated where. Also the attach protocol's bytes and the perf map format."""

from __future__ import annotations

import json

import pytest
from memdiag.probes.jvm.attach import parse_reply, request
from memdiag.probes.jvm.perfmap import short_name
from memdiag.probes.jvm.recording import (
    after_gc,
    allocating,
    class_name,
    held,
    parse_duration,
    parse_recording,
    parse_time,
)
from memdiag.system.perfmap import PerfMap, parse_perf_map

T0 = "2026-12-01T21:53:58.000000000Z"


def frame(cls: str, method: str, descriptor: str, line: int, kind: str = "JIT compiled") -> dict:
    return {
        "method": {"type": {"name": cls}, "name": method, "descriptor": descriptor},
        "lineNumber": line,
        "type": kind,
    }


PROCESS_BATCH = [
    frame("OrderService", "processBatch", "(I)[B", 10),
    frame("OrderService", "main", "([Ljava/lang/String;)V", 30),
]
LOAD = [frame("LruCache", "load", "(I)[B", 27, "Inlined"), frame("LruCache", "lookup", "(I)[B", 35)]


def mirror(name: str) -> dict:
    return {"type": {"name": "java/lang/Class"}, "description": f"Class Name: {name}"}


def retry_queue_chain() -> dict:
    """byte[] <- Object[] [421] <- ArrayList.elementData <- OrderService.retryQueue (static)."""
    array_list = {
        "type": {"name": "java/util/ArrayList"},
        "description": "Size: 3037",
        "referrer": {"field": {"name": "retryQueue", "modifiers": 0x818}, "object": mirror("OrderService"), "skip": 0},
    }
    elements = {
        "type": {"name": "[Ljava/lang/Object;"},
        "referrer": {"field": {"name": "elementData", "modifiers": 128}, "object": array_list, "skip": 0},
    }
    return {"type": {"name": "[B"}, "referrer": {"array": {"size": 4164, "index": 421}, "object": elements, "skip": 0}}


def old_sample(allocated: str, obj: dict, stack: list[dict], rooted: bool = True) -> dict:
    values = {
        "startTime": "2026-12-01T21:54:19.796230290Z",
        "allocationTime": allocated,
        "objectAge": "PT20.868133367S",
        "arrayElements": 16384,
        "object": obj,
        "stackTrace": {"truncated": False, "frames": stack},
        "root": {"description": "Thread Name: main", "system": "Threads", "type": "Stack Variable"} if rooted else None,
    }
    return {"type": "jdk.OldObjectSample", "values": values}


def recording_json() -> str:
    events = [
        old_sample("2026-12-01T21:53:58.500000000Z", retry_queue_chain(), PROCESS_BATCH),
        old_sample("2026-12-01T21:54:08.000000000Z", retry_queue_chain(), PROCESS_BATCH),
        old_sample("2026-12-01T21:54:10.000000000Z", {"type": {"name": "[B"}}, LOAD, rooted=False),
        old_sample("2026-12-01T21:54:11.000000000Z", {"type": {"name": "[B"}}, PROCESS_BATCH, rooted=False),
        {
            "type": "jdk.ObjectAllocationSample",
            "values": {
                "startTime": T0,
                "objectClass": {"name": "[B"},
                "weight": 54922856,
                "stackTrace": {"frames": PROCESS_BATCH},
            },
        },
        {
            "type": "jdk.ObjectAllocationSample",
            "values": {
                "startTime": T0,
                "objectClass": {"name": "[Ljava/lang/Object;"},
                "weight": 1000,
                "stackTrace": {
                    "frames": [
                        frame("java/util/Arrays", "copyOf", "([Ljava/lang/Object;I)[Ljava/lang/Object;", 3512),
                        frame("java/util/ArrayList", "grow", "(I)[Ljava/lang/Object;", 237),
                        frame("OrderService", "handle", "(II)V", 20),
                    ]
                },
            },
        },
        {
            "type": "jdk.GCHeapSummary",
            "values": {
                "startTime": "2026-12-01T21:53:59.869378429Z",
                "gcId": 3,
                "when": "After GC",
                "heapSpace": {"start": 3221225472, "reservedEnd": 4294967296},
                "heapUsed": 36279296,
            },
        },
        {
            "type": "jdk.GCHeapSummary",
            "values": {"startTime": "2026-12-01T21:53:59.800000000Z", "gcId": 3, "when": "Before GC", "heapUsed": 9e7},
        },
        {
            "type": "jdk.GarbageCollection",
            "values": {
                "startTime": "2026-12-01T21:53:59.8Z",
                "gcId": 3,
                "name": "G1New",
                "cause": "G1 Evacuation Pause",
                "sumOfPauses": "PT0.065013234S",
            },
        },
        {"type": "jdk.DirectBufferStatistics", "values": {"memoryUsed": 32767}},
    ]
    return json.dumps({"recording": {"events": events}})


def test_class_names_and_times_as_java_writes_them():
    assert class_name("[B") == "byte[]"
    assert class_name("[[Ljava/lang/String;") == "java.lang.String[][]"
    assert class_name("java/util/HashMap$Node") == "java.util.HashMap$Node"
    assert parse_time("2026-12-01T21:53:58.500000000Z") - parse_time(T0) == pytest.approx(0.5)
    assert parse_duration("PT0.065013234S") == pytest.approx(0.065013234)
    assert parse_duration("PT1M2S") == 62


def test_old_samples_name_the_class_the_site_and_the_static_field_that_holds_them():
    rec = parse_recording(recording_json())
    first = rec.old[0]
    assert first.cls == "byte[]" and first.array_length == 16384
    assert str(first.frames[0]) == "OrderService.processBatch(int) line: 10"
    assert first.chain == ["java.lang.Object[] [421]", "java.util.ArrayList.elementData", "OrderService.retryQueue"]
    assert first.anchor == "OrderService.retryQueue"
    assert first.holder_detail == "Size: 3037"  # the ArrayList's, not the class mirror's
    assert rec.old[2].anchor is None  # no path to a root: garbage the collector had not freed yet
    assert rec.heap_range == (3221225472, 4294967296) and rec.direct_buffers == 32767
    assert after_gc(rec) == [(pytest.approx(parse_time("2026-12-01T21:53:59.869378429Z")), 36279296)]
    assert rec.collections[0].pause_s == pytest.approx(0.065013234)


def test_held_groups_rooted_samples_and_says_how_far_back_they_go():
    rec = parse_recording(recording_json())
    start, stop = parse_time(T0), parse_time("2026-12-01T21:54:18.000000000Z")
    (group,) = held(rec, start, stop)
    assert (group.cls, group.site, group.anchor) == (
        "byte[]",
        "OrderService.processBatch(int) line: 10",
        "OrderService.retryQueue",
    )
    assert group.samples == 2 and group.share == 100
    assert group.let_go == 1 and group.kept_percent == pytest.approx(200 / 3)  # the LruCache sample is not its
    assert group.oldest_age_s == pytest.approx(19.5)
    assert group.span_percent == pytest.approx(97.5)


def test_allocation_sites_are_named_past_the_jdks_own_frames():
    rec = parse_recording(recording_json())
    by_class = {a.cls: a for a in allocating(rec)}
    assert by_class["byte[]"].site == "OrderService.processBatch(int) line: 10"
    assert by_class["byte[]"].bytes == 54922856
    assert by_class["java.lang.Object[]"].site == "OrderService.handle(int, int) line: 20"
    assert str(by_class["java.lang.Object[]"].frames[0]) == "java.util.Arrays.copyOf(Object[], int) line: 3512"


def test_attach_request_and_reply_bytes():
    assert request("JFR.stop name=memdiag-1") == b"1\0jcmd\0JFR.stop name=memdiag-1\0\0\0"
    assert parse_reply(b'0\nStopped recording "x".\n') == (0, 'Stopped recording "x".\n')
    assert parse_reply(b"101\n") == (101, "")
    assert parse_reply(b"garbage") == (None, "garbage")
    with pytest.raises(ValueError):
        request("x" * 2000)


def test_hotspots_perf_map_names_are_read_as_java_stacks_print_methods():
    """HotSpot's Compiler.perfmap lines (`0xSTART 0xSIZE <return type> <method>(<parameters>)`)
    through the perf map reader (system/perfmap.py), the return type dropped."""
    text = (
        "0x00007fc75cec7620 0x0000000000000208 boolean java.util.ArrayList.add(java.lang.Object)\n"
        "0x00007fc75cec7b20 0x0000000000000238 void HeapThrash.churn(int)\n"
    )
    pm = PerfMap("perf-1.map", parse_perf_map(text), len(text), False)
    hit = pm.lookup(0x7FC75CEC7620 + 0x10)
    assert hit is not None and short_name(hit.name) == "java.util.ArrayList.add(java.lang.Object)"
    assert short_name(pm.lookup(0x7FC75CEC7B20).name) == "HeapThrash.churn(int)"
    assert short_name("Interpreter") == "Interpreter" and short_name("StubRoutines (1)") == "StubRoutines (1)"
