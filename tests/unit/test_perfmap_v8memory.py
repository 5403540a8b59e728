"""Perf maps (V8's names, the newest entry winning, the namespace pid in the file's name) and the
smaps split of a Node process (V8's pages below 64 TiB, malloc'd memory elsewhere), on fixtures."""

from __future__ import annotations

import os
from pathlib import Path

from memdiag.system.perfmap import JitSymbol, parse_perf_map, perf_map_path, read_perf_map
from memdiag.system.v8memory import parse_smaps


def test_v8_names_read_as_function_and_script_line():
    cases = {
        "JS:*handleOrder /srv/orders/app.js:17:21": ("handleOrder", "app.js:17"),
        "JS:^rememberFailure /srv/orders/app.js:11:25": ("rememberFailure", "app.js:11"),
        "JS:~ node:internal/timers:120:65": ("(anonymous at node:internal/timers:120)", "node:internal/timers:120"),
        "JS:^ /srv/leaky.js:10:25": ("(anonymous at leaky.js:10)", "leaky.js:10"),
        "LazyCompile:*fetch /srv/a.js:3": ("fetch", "a.js:3"),
        "Builtin:ArrayPrototypePush": ("Builtin:ArrayPrototypePush", None),
        "Lcom/shop/Orders;::add": ("Lcom/shop/Orders;::add", None),  # a JVM agent's: kept as written
    }
    for name, want in cases.items():
        assert JitSymbol(start=0, size=1, name=name, order=0).function() == want, name


def test_the_newest_entry_covering_an_address_names_it():
    text = "1000 100 JS:~old /a.js:1:1\n1000 80 JS:*new /a.js:1:1\n2000 10 Builtin:X\nnot a line\n"
    symbols = parse_perf_map(text)
    assert [s.order for s in symbols] == [0, 1, 2]
    from memdiag.system.perfmap import PerfMap

    pm = PerfMap("/tmp/perf-1.map", symbols, len(text), False)
    assert pm.lookup(0x1010).name == "JS:*new /a.js:1:1"
    assert pm.lookup(0x1090).name == "JS:~old /a.js:1:1"  # past the newer entry's end, the older still covers it
    assert pm.lookup(0x2005).name == "Builtin:X"
    assert pm.lookup(0x0FFF) is None and pm.lookup(0x2010) is None


def test_the_map_is_found_under_the_processs_root_by_its_own_pid(tmp_path):
    proc = tmp_path / "proc"
    (proc / "4242" / "root" / "tmp").mkdir(parents=True)
    uid = "\t".join([str(os.geteuid())] * 4)  # the map is the process's own file: written by its effective uid
    (proc / "4242" / "status").write_text(f"Name:\tnode\nPid:\t4242\nUid:\t{uid}\nNSpid:\t4242\t7\n")
    assert perf_map_path(4242, proc) == proc / "4242" / "root" / "tmp" / "perf-7.map"
    assert read_perf_map(4242, proc) is None  # no map: the process was not asked for one
    (proc / "4242" / "root" / "tmp" / "perf-7.map").write_text("7f0000001000 40 JS:*f /x.js:2:3\n")
    pm = read_perf_map(4242, proc)
    assert pm.lookup(0x7F0000001020).function() == ("f", "x.js:2")


SMAPS = """\
00400000-00b6f000 r--p 00000000 08:01 1234 /usr/bin/node
Rss:                5944 kB
05600000-0563a000 rw-p 05200000 08:01 1234 /usr/bin/node
Rss:                 232 kB
0563a000-05689000 rw-p 00000000 00:00 0
Rss:                 176 kB
1c470000-1dc56000 rw-p 00000000 00:00 0                                  [heap]
Rss:               24348 kB
8be622c0000-8be62300000 rw-p 00000000 00:00 0
Rss:                 256 kB
a0f1d500000-a0f1d540000 rw-p 00000000 00:00 0
Rss:                 128 kB
213672b00000-213672b42000 r--p 00000000 00:00 0
Rss:                  52 kB
7fc308000000-7fc30803c000 rwxp 00000000 00:00 0
Rss:                  76 kB
7fc318000000-7fc3180b2000 rw-p 00000000 00:00 0
Rss:                 456 kB
7fc31c000000-7fc31c010000 rw-p 00000000 00:00 0                          [anon: glibc: malloc arena]
Rss:                  64 kB
7ffd2b6a0000-7ffd2b6c1000 rw-p 00000000 00:00 0                          [stack]
Rss:                  60 kB
"""


def test_smaps_split_v8_pages_from_malloc():
    m = parse_smaps(SMAPS)
    assert (m.v8_mappings, m.v8_mapped) == (3, 2 * 256 * 1024)  # the read-only page is not committed heap
    assert m.v8_resident == (256 + 128 + 52) * 1024
    # [heap], the binary's .bss (as parse_v8_heap_ranges leaves it out), an arena, a named arena; not [stack]
    assert m.native_resident == (24348 + 176 + 456 + 64) * 1024
    assert m.jit_resident == 76 * 1024


def test_a_missing_process_has_no_split(tmp_path: Path):
    from memdiag.system.v8memory import read_v8_memory

    assert read_v8_memory(99, tmp_path) is None


MAPS = """\
00400000-00b6f000 r-xp 00000000 08:01 1234 /usr/bin/node
05600000-0563a000 rw-p 05200000 08:01 1234 /usr/bin/node
0563a000-05689000 rw-p 00000000 00:00 0
1c470000-1dc56000 rw-p 00000000 00:00 0                                  [heap]
8be622c0000-8be62300000 rw-p 00000000 00:00 0
8be62300000-8be62340000 ---p 00000000 00:00 0
213672b00000-213672b42000 rw-p 00000000 00:00 0                          [anon:v8]
7fc318000000-7fc3180b2000 rw-p 00000000 00:00 0
7ffd2b6a0000-7ffd2b6c1000 rw-p 00000000 00:00 0                          [stack]
"""


def test_v8_heap_ranges_are_its_pages_not_the_binarys_bss_nor_malloc():
    from memdiag.system.v8memory import parse_v8_heap_ranges

    # the node binary's .bss continues its last data page (anonymous, low, yet no V8 page); [heap],
    # a reservation without access, a malloc arena up high and the stack are none of V8's heap
    assert parse_v8_heap_ranges(MAPS) == ((0x8BE622C0000, 0x8BE62300000), (0x213672B00000, 0x213672B42000))


def test_v8_heap_ranges_are_read_for_node_alone(tmp_path: Path):
    from memdiag.system.v8memory import read_v8_heap_ranges

    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "maps").write_text(MAPS)
    assert read_v8_heap_ranges(42, tmp_path) == ((0x8BE622C0000, 0x8BE62300000), (0x213672B00000, 0x213672B42000))
    (tmp_path / "42" / "maps").write_text(MAPS.replace("/usr/bin/node", "/usr/bin/orderd"))
    assert read_v8_heap_ranges(42, tmp_path) is None  # no Node: nothing is V8's heap
    assert read_v8_heap_ranges(43, tmp_path) is None  # gone
