"""A long window's pieces without a target to trace: the sampler's memory bounded on real /proc
readings (thinned, said), the cycles' length, and what the cycles say together."""

import os
import subprocess
import sys
from types import SimpleNamespace

from memdiag.diagnose.culprit import default_classes
from memdiag.diagnose.cycles import INTERIM_EVERY_S, TrailFold, cycle_facts, cycle_length, watch
from memdiag.diagnose.observe import Sampler
from memdiag.diagnose.report import CycleRecord, CycleStack
from memdiag.diagnose.target import pid_target
from memdiag.probes.face import TrailItem
from memdiag.system._parse import kv_lines


def test_the_sampler_keeps_at_most_its_bound_the_first_sample_kept_and_says_what_it_dropped(monkeypatch):
    # a bound well under what 2 s of sampling takes on a slow host (a reading took ~30 ms on one:
    # 51 samples in 1.5 s), so the thinning is exercised on every host
    monkeypatch.setattr(Sampler, "MAX_SAMPLES", 16)
    s = Sampler(pid_target(os.getpid()), duration=2.0, interval=0.01)
    obs = s.run()
    kept = len(obs.snapshots)
    assert kept <= 16 and obs.thinned > 0
    assert obs.thinned + kept > 24  # it sampled more than it kept: the older half thinned
    assert obs.snapshots[0].t <= obs.snapshots[1].t and obs.thinned_before_s is not None
    gaps = [b.t - a.t for a, b in zip(obs.snapshots, obs.snapshots[1:], strict=False)]
    assert gaps[0] > gaps[-1]  # the older, the coarser; the recent part at the sampling interval


def test_samples_share_the_names_of_their_counters():
    # a long window keeps hundreds of samples: each sample's counters are keyed by the same strings,
    # not a new copy of each name per reading (a cgroup's memory.stat: 42 names, 2.6 KiB a sample)
    a = kv_lines("total_rss 4096\ntotal_cache 8192\n")
    b = kv_lines("".join(["total_rss 1\n", "total_cache 2\n"]))
    assert a.keys() == b.keys()
    assert all(x is y for x, y in zip(a, b, strict=True))
    # ...through a table of memdiag's own, not CPython's interned strings: that table sits near a
    # resize once memdiag's modules are imported, and a resize cost 0.9 MiB of the peak (_parse.py)
    name = kv_lines("memdiag_test_counter_x9 1\n")
    key = next(iter(name))
    assert sys.intern("".join(["memdiag_test_", "counter_x9"])) is not key


ARENAS = r"""
import ctypes, sys, tempfile, threading
from memdiag.diagnose.cli import one_malloc_arena
if sys.argv[1] == "one":
    assert one_malloc_arena()
together = threading.Barrier(4)
def work():
    together.wait()  # all four alive at once: none can take an arena another thread has let go
    keep = [bytearray(4096) for _ in range(64)]  # past pymalloc's 512 bytes: glibc's malloc
    together.wait()
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
with tempfile.NamedTemporaryFile("r") as out:
    f = libc.fopen(out.name.encode(), b"w"); libc.malloc_info(0, f); libc.fclose(f)
    print(out.read().count("<heap nr="))
"""


def test_memdiags_threads_share_one_malloc_arena():
    # glibc's own count of its arenas (malloc_info), after four threads allocated at once: one
    # arena with memdiag's setting, more without it (so the count can tell the two apart)
    def arenas(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True)
        return int(out.stdout)

    assert arenas("default") > 1
    assert arenas("one") == 1


def test_a_window_is_cut_in_cycles_only_when_long():
    assert cycle_length(30) is None and cycle_length(599) is None
    assert cycle_length(6 * 3600) == 900 and cycle_length(86400) == 3600
    assert cycle_length(700) == 60  # at least a minute
    assert cycle_length(90, asked=15) == 15 and cycle_length(90, asked=120) is None


def _cycle(i: int, leaked: dict[str, int]) -> CycleRecord:
    stacks = [CycleStack(probe="memleak", function=f, bytes=n << 10, leaked_count=n or None) for f, n in leaked.items()]
    return CycleRecord(index=i, start_s=i * 15.0, end_s=(i + 1) * 15.0, memory=1 << 20, stacks=stacks)


def test_what_the_cycles_say_together():
    records = [
        _cycle(0, {"cache_insert": 0}),
        _cycle(1, {"night_batch": 300}),
        CycleRecord(index=2, start_s=30, end_s=45),  # nothing traced in it
        _cycle(3, {"night_batch": 280, "cache_insert": 0}),
    ]
    assert cycle_facts(records) == {
        "window.cycles": 4,
        "window.cycles_traced": 3,
        "window.cycles_leaking": 2,
        "window.leak_function": "night_batch",
        "window.leak_function_cycles": 2,
    }
    assert cycle_facts([]) == {}


def _steps(i: int) -> list[TrailItem]:
    at = i * 15.0 + 1
    return [
        TrailItem(kind="budget", name="memleak", state="full", reason=f"{i} KiB/s priced", at_s=at),
        TrailItem(kind="probe", name="memleak", state="ok" if i != 4 else "partial", reason="asked", at_s=at + 5),
    ]


def test_a_long_windows_trail_keeps_the_first_and_last_cycles_in_full_and_counts_the_rest():
    before = [TrailItem(kind="rule", name="first-look", state="fired", reason="r", at_s=0.5)]
    fold = TrailFold(before)
    for i in range(10):
        trail = fold.add(i, _steps(i))
    assert trail[:3] == before + _steps(0)  # before the cycles, then the first cycle as it was
    assert trail[-3 * 2 :] == _steps(7) + _steps(8) + _steps(9)  # the last three as they were
    counted = trail[3:-6]
    # cycles 2-7 (1-based) counted, one line per step and outcome, in the order first seen
    assert [(t.kind, t.name, t.state) for t in counted] == [
        ("budget", "memleak", "full"),
        ("probe", "memleak", "ok"),
        ("probe", "memleak", "partial"),
    ]
    assert counted[0].reason.startswith("6 more times in cycles 2-7 (counted") and counted[0].at_s == 15.0 + 1
    assert counted[1].reason.startswith("5 more times in cycles 2-7") and counted[1].at_s == 15.0 + 6
    assert counted[2].reason.startswith("1 more time in cycle 5 ") and counted[2].at_s == 4 * 15.0 + 6
    assert [t.at_s for t in counted] == sorted(t.at_s for t in counted)  # in time order, by their first
    # bounded: ten more cycles add nothing but counts
    for i in range(10, 20):
        trail2 = fold.add(i, _steps(i))
    assert len(trail2) == len(trail)


def test_a_short_run_of_cycles_keeps_its_whole_trail():
    fold = TrailFold([])
    for i in range(4):
        trail = fold.add(i, _steps(i))
    assert trail == [t for i in range(4) for t in _steps(i)]


class _Window:
    """watch()'s engine and sampler for a window of `cycles` cycles of 10 s on a clock of its own:
    no probe asked, the counters' wait the only thing that moves time."""

    def __init__(self, cycles: int):
        self.now, self.duration, self.cycle_s = 0.0, cycles * 10.0, 10.0
        self.cycle_end = None
        self.trail, self.records, self.results, self.kept, self.told = [], [], {}, {}, []
        self.classes = default_classes()
        self.on_cycle = self.told.append

    # the engine's side
    def elapsed(self) -> float:
        return self.now

    def begin_cycle(self, end_s: float) -> int:
        self.cycle_end = end_s
        return len(self.trail)

    def rounds(self, sampler) -> None:
        pass

    def end_cycle(self, record, trail) -> None:
        self.records.append(record)
        self.trail = trail

    def interim(self, obs, done: str) -> str:
        return done

    def end_cycles(self) -> None:
        self.cycle_end = None

    # the sampler's side
    def alive(self) -> bool:
        return True

    def wait(self, seconds: float, interrupted) -> None:
        self.now += seconds

    def so_far(self):
        return SimpleNamespace(snapshots=[], last_cgroup=None)


def test_the_report_is_rewritten_after_the_first_cycle_then_at_most_once_a_minute():
    w = _Window(cycles=14)
    watch(w, w)
    assert len(w.records) == 14
    # after cycle 1 (10 s), then the first cycle ending 60 s or more after the last rewrite (70 s, 130 s)
    assert w.told == ["cycle 1 of 14", "cycle 7 of 14", "cycle 13 of 14"]
    assert INTERIM_EVERY_S == 60.0
