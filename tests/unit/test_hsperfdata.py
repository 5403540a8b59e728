"""The hsperfdata reader on files built here in HotSpot's documented layout (perfMemory.hpp,
PerfData 2.0), both byte orders, and what the JVM's counters say about its heap; the RSS split
on smaps text in the kernel's format."""

from __future__ import annotations

import struct

import pytest
from memdiag.system.hsperfdata import parse_perfdata
from memdiag.system.jvm import heap_range, jvm_counters, jvm_library, parse_smaps, split_memory


def perfdata(entries: dict[str, int | str], order: str = "<", major: int = 2, magic: bytes = b"\xca\xfe\xc0\xc0"):
    """An hsperfdata file: the prologue, then one entry per counter (longs 'J', strings 'B')."""
    body = b""
    for name, value in entries.items():
        raw_name = name.encode() + b"\0"
        header = struct.calcsize(order + "iiibbbbi")
        name_off = header
        data_off = (name_off + len(raw_name) + 7) // 8 * 8
        if isinstance(value, int):
            data, dtype, vlen, units = struct.pack(order + "q", value), ord("J"), 0, 2
        else:
            data, dtype, vlen, units = value.encode() + b"\0", ord("B"), len(value) + 1, 5
        length = (data_off + len(data) + 7) // 8 * 8
        entry = struct.pack(order + "iiibbbbi", length, name_off, vlen, dtype, 0, units, 3, data_off)
        entry += b"\0" * (name_off - len(entry)) + raw_name
        entry += b"\0" * (data_off - len(entry)) + data
        body += entry + b"\0" * (length - len(entry))
    prologue = magic + struct.pack(
        order + "bbbbiiqii", 1 if order == "<" else 0, major, 0, 1, 32 + len(body), 0, 0, 32, len(entries)
    )
    return prologue + body


G1 = {
    "sun.os.hrt.frequency": 1_000_000_000,
    "sun.os.hrt.ticks": 5_000_000_000,
    "java.property.java.vm.name": "OpenJDK 64-Bit Server VM",
    "java.property.java.home": "/usr/lib/jvm/java-17-openjdk-amd64",
    "java.rt.vmArgs": "-Xmx1g",
    "sun.rt.jvmCapabilities": "1100000000000000000000000000000000000000000000000000000000000000",
    "sun.gc.policy.name": "GarbageFirst",
    "sun.gc.policy.generations": 2,
    "sun.gc.generation.0.name": "young",
    "sun.gc.generation.0.spaces": 3,
    "sun.gc.generation.0.capacity": 100 << 20,
    "sun.gc.generation.0.maxCapacity": 1 << 30,
    "sun.gc.generation.0.space.0.name": "eden",
    "sun.gc.generation.0.space.0.used": 20 << 20,
    "sun.gc.generation.0.space.1.name": "s0",
    "sun.gc.generation.0.space.1.used": 0,
    "sun.gc.generation.0.space.2.name": "s1",
    "sun.gc.generation.0.space.2.used": 4 << 20,
    "sun.gc.generation.1.name": "old",
    "sun.gc.generation.1.spaces": 1,
    "sun.gc.generation.1.capacity": 300 << 20,
    "sun.gc.generation.1.maxCapacity": 1 << 30,
    "sun.gc.generation.1.space.0.name": "space",
    "sun.gc.generation.1.space.0.used": 90 << 20,
    "sun.gc.collector.0.name": "G1 young collection pauses",
    "sun.gc.collector.0.invocations": 12,
    "sun.gc.collector.0.time": 300_000_000,
    "sun.gc.collector.1.name": "G1 full collection pauses",
    "sun.gc.collector.1.invocations": 1,
    "sun.gc.collector.1.time": 100_000_000,
    "sun.gc.collector.2.name": "G1 concurrent cycle pauses",
    "sun.gc.collector.2.invocations": 4,
    "sun.gc.collector.2.time": 0,
    "sun.gc.lastCause": "G1 Evacuation Pause",
    "sun.gc.metaspace.capacity": 8 << 20,
    "sun.gc.metaspace.used": 6 << 20,
}


@pytest.mark.parametrize("order", ["<", ">"])
def test_counters_read_in_either_byte_order(order):
    perf = parse_perfdata(perfdata(G1, order))
    assert perf is not None and perf.major == 2 and perf.accessible
    assert perf.number("sun.gc.collector.0.invocations") == 12
    assert perf.text("sun.gc.policy.name") == "GarbageFirst"
    assert perf.skipped == 0 and len(perf.entries) == len(G1)


def test_g1_heap_is_its_largest_generation_and_after_gc_is_old_plus_survivors():
    c = jvm_counters(parse_perfdata(perfdata(G1)))
    assert c.heap_max == 1 << 30  # G1's generations each span the heap: their maximum, not their sum
    assert c.heap_committed == 400 << 20
    assert c.heap_used == 114 << 20
    assert c.after_gc_used == 94 << 20  # eden is what a collection empties
    assert (c.gc_count, c.full_gc_count, c.evacuations) == (17, 1, 13)  # remark and cleanup pauses move nothing
    assert c.gc_time_s == pytest.approx(0.4)
    assert c.clock_s == pytest.approx(5.0)
    assert c.attach_supported is True
    assert c.java_home == "/usr/lib/jvm/java-17-openjdk-amd64"
    assert c.metaspace_committed == 8 << 20


def test_serial_heap_is_the_sum_of_its_generations_and_attach_off_is_seen():
    serial = {k: v for k, v in G1.items() if not k.startswith("sun.gc.generation.1.space")}
    serial.update(
        {
            "sun.gc.policy.name": "Copy:MSC",
            "sun.gc.generation.0.maxCapacity": 90 << 20,
            "sun.gc.generation.1.maxCapacity": 166 << 20,
            "sun.gc.generation.1.spaces": 0,
            "sun.rt.jvmCapabilities": "0" * 64,
        }
    )
    c = jvm_counters(parse_perfdata(perfdata(serial)))
    assert c.heap_max == 256 << 20
    assert c.attach_supported is False


def test_not_a_perfdata_file_is_none_and_truncation_stops_cleanly():
    good = perfdata(G1)
    assert parse_perfdata(good.replace(b"\xca\xfe\xc0\xc0", b"\xca\xfe\xba\xbe", 1)) is None
    assert parse_perfdata(perfdata(G1, major=1)) is None
    assert parse_perfdata(b"") is None
    cut = parse_perfdata(good[: len(good) // 2])
    assert cut is not None and 0 < len(cut.entries) < len(G1)


def test_an_entry_type_not_decoded_is_skipped_not_guessed():
    data = bytearray(perfdata({"a": 1, "b": 2}))
    # the first entry's type code becomes 'I' (never written by HotSpot): skipped, b still read
    data[32 + 12] = ord("I")
    perf = parse_perfdata(bytes(data))
    assert perf.entries == {"b": 2} and perf.skipped == 1


MAPS_JVM = """\
55f95b16c000-55f95b1b3000 rw-p 00000000 00:00 0 [heap]
7f61dc851000-7f61dd5a4000 r-xp 00251000 fe:00 328261 /usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so
"""


def test_hotspot_is_libjvm_mapped_executable_and_openj9_is_not():
    assert jvm_library(MAPS_JVM).endswith("/server/libjvm.so")
    j9 = MAPS_JVM + "7f0000000000-7f0000100000 r-xp 00000000 fe:00 1 /opt/j9/lib/default/libj9vm29.so\n"
    assert jvm_library(j9) is None
    assert jvm_library("7f0000000000-7f0000100000 r-xp 00000000 fe:00 1 /usr/bin/python3.11\n") is None


def smaps(regions: list[tuple[int, int, str, str, int]]) -> str:
    """smaps text: (start, end, perms, path, rss KiB) per mapping."""
    out = []
    for lo, hi, perms, path, rss in regions:
        out.append(f"{lo:x}-{hi:x} {perms} 00000000 00:00 0 {path}".rstrip())
        out += [f"Size: {(hi - lo) // 1024} kB", f"Rss: {rss} kB", "Swap: 0 kB"]
    return "\n".join(out) + "\n"


GiB = 1 << 30
JVM_SMAPS = [
    (0xC0000000, 0xD7A00000, "rw-p", "", 300_000),
    (0xD7A00000, 0xFFE00000, "---p", "", 0),
    (0xFFE00000, 0xFFE75000, "rw-p", "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/classes.jsa", 400),
    (0xFFE75000, 0x100000000, "rw-p", "", 500),
    (0x7F0000000000, 0x7F0000400000, "rwxp", "", 2_000),
    (0x7F0000400000, 0x7F0000500000, "rw-p", "", 800),
    (0x7F0001000000, 0x7F0002000000, "r-xp", "/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so", 20_000),
    (0x7F0003000000, 0x7F0007000000, "rw-p", "", 50_000),
    (0x7FFC00000000, 0x7FFC00021000, "rw-p", "[stack]", 100),
]


def test_the_heap_is_the_anonymous_run_as_long_as_its_maximum_with_the_cds_archive_inside():
    regions = parse_smaps(smaps(JVM_SMAPS))
    assert len(regions) == len(JVM_SMAPS) and regions[0].rss == 300_000 * 1024
    assert heap_range(regions, GiB + 24) == (0xC0000000, 0x100000000)
    assert heap_range(regions, 4 * GiB) is None  # no run of that span: unknown, not guessed


def test_rss_split_into_heap_code_stacks_files_metaspace_and_the_rest():
    c = jvm_counters(parse_perfdata(perfdata(G1)))
    regions = parse_smaps(smaps(JVM_SMAPS))
    m = split_memory(regions, c, stack_pointers=[0x7F0000480000])
    assert m.heap == (300_000 + 400 + 500) * 1024
    assert m.code == 2_000 * 1024
    assert m.stacks == (800 + 100) * 1024 and m.stack_count == 2
    assert m.files == 20_000 * 1024
    assert m.metaspace == 8 << 20
    assert m.other == m.rss - m.heap - m.code - m.stacks - m.files - m.metaspace
    assert m.outside == m.rss - m.heap


def test_without_the_heap_range_the_rest_is_unknown():
    regions = parse_smaps(smaps(JVM_SMAPS[4:]))
    m = split_memory(regions, jvm_counters(parse_perfdata(perfdata(G1))), stack_pointers=[])
    assert m.heap is None and m.other is None and m.outside is None
