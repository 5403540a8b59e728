"""Diagnoses of real JVMs (Debian's OpenJDK 17), end to end: the kit's Java programs and a real
Java server from Debian (H2). The JVM's own counters say where the growth is; its flight recorder,
through the attach socket, names the class, the Java method and line that allocated it and the
field that holds it. The seed's incident and the real server are diagnosed as a user would, with no
option (30 s, 2%): the recording is priced by what the application pays (its threads' wait for a
CPU and the JVM's safepoints), and JFR's first start, whose JIT compilation takes 0.5-1 s of the
JVM's CPU, costs an application that leaves cores idle little of that. A JVM that keeps every CPU
busy pays all of it: there, at 2%, two class histograms name the class and the advice says the
command that pays for the recording; below their price too, the counters alone speak. The other
cases keep --budget 10."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from figures import read_report
from jvmkit import have_jdk, wait_warmed_up
from kit import MEMDIAG, wait_until
from memdiag.probes.jvm import costs
from memdiag.probes.jvm.attach import describe_target, jcmd
from memdiag.probes.jvm.meter import JVM_OWN

pytestmark = [
    pytest.mark.skipif(not have_jdk(), reason="needs a JDK (scripts/setup.sh --test installs openjdk-17)"),
    # its JVMs' recording and histogram costs are measured and kept (probes/jvm/costs.py): run alone
    pytest.mark.alone,
]

H2_JAR = Path("/usr/share/java/h2.jar")  # Debian's libh2-java (scripts/setup.sh --test)
WINDOW = ("--duration", "30", "--budget", "10")


DEFAULTS = ("--output",)  # no option but where the report goes: the window and the budget are memdiag's own


def diagnose(memdiag, out: Path, pid: int, *extra: str) -> dict:
    wait_warmed_up(pid)
    options = () if extra == DEFAULTS else (extra or WINDOW)
    r = memdiag("--pid", str(pid), *options, "--output", str(out), timeout=240)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    return json.loads((out / "report.json").read_text())


def trail(rep: dict, kind: str, name: str) -> list[dict]:
    return [t for t in rep["trail"] if t["kind"] == kind and t["name"] == name]


def fired(rep: dict, rule: str) -> bool:
    return any(t["state"] == "fired" for t in trail(rep, "rule", rule))


def section(rep: dict, title: str) -> dict:
    return next(s for s in rep["sections"] if s["title"] == title)


def left_in_jvm(pid: int) -> list[str]:
    """What memdiag may have left in the JVM's /tmp and working directory: the attach trigger, a
    recording's settings or file, a perf map (the JVM's own attach socket is not memdiag's)."""
    names = [*Path(f"/proc/{pid}/root/tmp").iterdir(), *Path(f"/proc/{pid}/cwd").iterdir()]
    mine = re.compile(rf"^(memdiag-[0-9a-f]{{12}}\.(jfr|jfc)|\.attach_pid{pid}|perf-{pid}\.map)$")
    return sorted(p.name for p in names if mine.match(p.name))


def jfr_threads(pid: int) -> list[str]:
    """JFR's own threads in the JVM: there once a recording was started in it, ever."""
    comms = [(p / "comm").read_text().strip() for p in Path(f"/proc/{pid}/task").iterdir()]
    return [c for c in comms if c.startswith("JFR ")]


def recordings_running(pid: int) -> list[str]:
    out = jcmd(describe_target(pid), "JFR.check").output
    return [line for line in out.splitlines() if "memdiag-" in line and "(running)" in line]


def test_a_static_retry_list_is_growth_in_the_java_heap_named_by_class_method_and_field(memdiag, java, tmp_path):
    """The seed's incident at memdiag's defaults: `memdiag --pid N` names the class, the allocating
    method and the holding field."""
    w = java("OrderService", "1000", jvm=["-Xmx512m"])
    rep = diagnose(memdiag, tmp_path, w.pid, *DEFAULTS)
    assert rep["overhead"]["budget_percent"] == 2 and rep["overhead"]["window_s"] == pytest.approx(30, abs=2)
    v = rep["verdict"]
    assert v["kind"] == "growth" and v["rule"] == "java-heap-retained", v["summary"]
    assert "growth in the Java heap" in v["summary"]
    assert "byte[] objects allocated at OrderService.processBatch(int) line: " in v["summary"]
    assert "held by OrderService.retryQueue" in v["summary"]
    assert v["culprit"]["function"].startswith("OrderService.processBatch(int) line: ")
    holders = section(rep, "Java heap: what holds it")["rows"]
    assert holders[0][:3] == ["byte[]", holders[0][1], "OrderService.retryQueue"]
    assert "java.util.ArrayList.elementData" in holders[0][-1]
    plan = trail(rep, "budget", "jfr")[0]
    assert plan["state"] == "full" and "what the application would pay" in plan["reason"], plan
    assert not trail(rep, "probe", "memleak")  # a malloc probe sees none of the Java heap: not asked
    jfr = next(p for p in rep["probes"] if p["name"] == "jfr")
    assert jfr["on_target"] and jfr["overhead_percent"] is not None
    # what the application paid, and beside it the JVM's CPU for the recording (its first start's JIT
    # compilation among it), each a share of the window
    (name, what, paid, cpu), *_ = rep["overhead"]["measured_otherwise"]
    assert name == "jfr" and what.startswith("what the application paid") and paid == jfr["overhead_percent"]
    assert cpu is not None and cpu > 0
    assert "the JVM's threads doing the recording's work used" in (tmp_path / "report.md").read_text()
    over = 0.0
    if jfr["status"] != "ok":
        # JFR's first start in a JVM is one command that cannot be cut short and costs 1.3-2.9 s of
        # the target's CPU here (the price is the median): past the allowance the recording stops at
        # the next tick, and what the target paid is over by the stop's own cost at most
        assert jfr["status"] == "partial"
        assert "detached early: its measured cost went over the budget" in trail(rep, "probe", "jfr")[0]["reason"]
        over = 0.01
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"] * (1 + over)
    rows = {r["name"]: r for r in rep["counters"]["rows"] if r["scope"] == "runtime"}
    # G1's counters give each generation's maximum as -Xmx plus a few bytes of its own bookkeeping
    assert abs(rows["heap_max"]["last"] - (512 << 20)) < 1024 and rows["heap_growth_share"]["last"] >= 50
    assert rep["counters"]["trends"]["jvm.live_set"]["shape"] == "climbing"
    md = (tmp_path / "report.md").read_text()
    assert "### JVM counters" in md and "### Java heap: what holds it" in md
    assert "OrderService.retryQueue" in (tmp_path / "report.html").read_text()
    assert left_in_jvm(w.pid) == [] and recordings_running(w.pid) == []


def test_a_bounded_lru_cache_is_a_cache_that_turns_over(memdiag, java, tmp_path):
    w = java("LruCache", "1000", "4000", jvm=["-Xmx1g"])
    rep = diagnose(memdiag, tmp_path, w.pid, *DEFAULTS)
    v = rep["verdict"]
    assert trail(rep, "probe", "jfr"), rep["trail"]  # recorded at the defaults: the cache's holder is named
    none_survived = "no old-object sample survived to the stop (nothing sampled outlived a collection)"
    if v["kind"] == "growth" and none_survived in rep["caveats"]:
        # Nothing in the recording says what the heap keeps: every old-object sample died before the
        # stop (4 of 11 runs alone here on 2026-12-06, at that day's code and the code before it; the
        # recording had 0 unrooted samples where a passing run had 250 and 2 held). The verdict then
        # says the growth is unnamed rather than guess; what allocates is still named.
        assert v["rule"] == "java-heap-growth-unnamed", v["summary"]
        assert "no sampled object was still reachable at its stop" in v["summary"], v["summary"]
        allocates = section(rep, "Java heap: what allocates")["rows"]
        assert allocates[0][0] == "byte[]" and allocates[0][1].startswith("LruCache.load(int) line: "), allocates[0]
        assert left_in_jvm(w.pid) == []
        return
    assert v["kind"] == "cache", v["summary"]
    holders = section(rep, "Java heap: what holds it")["rows"]
    if holders:  # the sampled entries still in the cache at the stop (the JVM's sampler kept some)
        # its entries at the stop; at the first look too, unless (under load, as in CI once) the first
        # look found none of its objects sampled yet or was not taken: then the words say which
        # JFR gives each sample one path to a GC root: the static field, or (this stop's fresh-clone
        # run, under load) the main thread's frame in lookup(), which holds the cache while it runs
        by = holders[0][2]
        assert by in ("LruCache.cache", "LruCache$Cache.table, from a stack variable of thread main"), holders[0]
        assert f"held by {by} (4,000 entries at " in v["summary"], v["summary"]
        assert "allocated at LruCache.load(int) line: " in v["summary"] and "let go again" in v["summary"]
        assert holders[0][3] in ("4000, 4000", "?, 4000"), holders[0]
        if holders[0][3] == "?, 4000":
            assert "4,000 entries at the stop; " in v["summary"], v["summary"]
    else:  # none kept: the heap grew for garbage it turns over, by the counters or by the samples
        # (this stop's fresh-clone run: the live set climbed 64 to 208 MiB and all 184 samples the
        # recording found in the heap were reached from no root)
        assert v["rule"] in ("java-heap-expands", "java-heap-sampled-garbage"), v["summary"]
        if v["rule"] == "java-heap-sampled-garbage":
            assert (
                "objects the flight recorder sampled and found still in the heap are reached from no root"
                in (v["summary"])
            )
            assert "byte[] allocated at LruCache.load(int) line: " in v["summary"], v["summary"]
    assert left_in_jvm(w.pid) == []


def test_a_heap_near_its_maximum_thrashing_in_gc_is_pressure_in_the_java_heap(memdiag, java, tmp_path):
    w = java("HeapThrash", jvm=["-Xmx128m"])
    rep = diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    assert v["kind"] == "pressure" and v["rule"] == "java-heap-pressure", v["summary"]
    assert "pressure inside the Java heap" in v["summary"]
    rows = {r["name"]: r for r in rep["counters"]["rows"] if r["scope"] == "runtime"}
    assert rows["live_set_percent"]["last"] >= 80 and rows["gc_share"]["last"] > 7.7
    assert any(f["id"] == "java-heap-held" and "HeapThrash.records" in f["summary"] for f in rep["findings"])


def test_a_jni_native_leak_is_a_leak_named_by_its_c_function(memdiag, java, tmp_path):
    w = java("NativeLeak", "2000", jvm=["-Xmx256m"])
    rep = diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    assert v["kind"] == "leak", v["summary"]
    assert "leaks from stash_record" in v["summary"]
    assert v["culprit"]["function"] == "stash_record"
    # the Java frame above the JNI code, named from the JVM's perf map (Compiler.perfmap) as the JIT's
    stack = v["culprit"]["stack"]
    assert any(f.startswith("Java_NativeLeak_recordOrder") for f in stack), stack
    assert any(" (JIT code) [perf-" in f for f in stack), stack
    assert fired(rep, "java-native-growth") and not trail(rep, "probe", "jfr")
    assert left_in_jvm(w.pid) == []  # the perf map memdiag asked for is removed


@pytest.fixture
def jfr_start_unmeasured(tmp_path, monkeypatch):
    """memdiag's store of this host's JVM costs (probes/jvm/costs.py) without its measurements of a
    flight recording's start, so the start is priced at the prior (1.31 s of the JVM's CPU), as on a
    host that has not yet recorded a JVM of this build; the histograms' figures stay this host's.
    What a host measures is its own: 0.44-0.71 s for a first start here (once 1.88 s); a JVM keeping
    every CPU busy pays about all of that, 2% of 30 s being 600 ms, so with the median this host
    measured the cases below would sit at the budget's edge: priced at the prior they are over it
    on any host."""
    try:
        kept = json.loads(costs.STORE.read_text())
    except (OSError, ValueError):
        kept = {}
    for build in kept.values() if isinstance(kept, dict) else ():
        build.pop("cold_start_s", None)
    store = tmp_path / "jvm-costs" / "jvm-costs.json"
    store.parent.mkdir()
    store.write_text(json.dumps(kept))
    monkeypatch.setenv("MEMDIAG_JVM_COSTS", str(store))  # the memdiag run inherits it
    return store


CPUS = len(os.sched_getaffinity(0))


def test_at_the_defaults_a_jvm_keeping_every_cpu_busy_gets_two_class_histograms_and_the_command_that_pays(
    memdiag, java, tmp_path, jfr_start_unmeasured
):
    """A service that keeps every CPU busy pays all of JFR's first start (priced at the prior, 1.31 s
    of CPU): over 2% of a 30 s window; two class histograms (full collections) are not. The advice
    says the command whose budget or window pays for the recording."""
    w = java("OrderService", "1000", "8", str(CPUS), jvm=["-Xmx512m"])
    rep = diagnose(memdiag, tmp_path, w.pid, *DEFAULTS)
    v = rep["verdict"]
    plan = trail(rep, "budget", "jfr")[0]
    assert plan["state"] == "over-budget" and not trail(rep, "probe", "jfr")
    # its share of the CPUs before: each of them busy (pricers and the service's own thread)
    share = int(re.search(r"(\d+)% of it, the share of its", plan["reason"]).group(1))
    assert share >= 90, plan["reason"]
    pays = re.search(r"`memdiag --pid (\d+) --budget ([\d.]+)` \(or `--duration (\d+)` at --budget 2\)", v["summary"])
    assert pays and int(pays.group(1)) == w.pid and float(pays.group(2)) > 2 and int(pays.group(3)) > 30, v["summary"]
    assert any(pays.group(0) in step for step in rep["next_steps"]), rep["next_steps"]
    # what the application pays is its own threads': every thread that is not the JVM's own, by name
    comms = {(t / "comm").read_text().strip() for t in Path(f"/proc/{w.pid}/task").iterdir()}
    assert {c for c in comms if not c.startswith(JVM_OWN)} == {"java", *(f"pricer-{i}" for i in range(CPUS))}
    assert not jfr_threads(w.pid)  # no recording was ever started in it
    assert trail(rep, "budget", "histogram")[0]["state"] == "full", trail(rep, "budget", "histogram")
    assert v["kind"] == "growth" and v["rule"] == "java-heap-class-grows", v["summary"]
    assert "live byte[] objects grew by " in v["summary"] and "the flight recorder would say" in v["summary"]
    rows = section(rep, "Java heap: classes that grew")["rows"]
    assert rows[0][0] == "byte[]", rows
    hist = next(p for p in rep["probes"] if p["name"] == "histogram")
    assert hist["status"] == "ok" and hist["on_target"] and hist["overhead_percent"] is not None
    assert rep["overhead"]["measured_percent"] <= rep["overhead"]["budget_percent"], rep["overhead"]
    assert len(trail(rep, "scan", "histogram")) == 2  # each look's pause, from the JVM's counters
    assert left_in_jvm(w.pid) == []


def test_at_the_defaults_a_bounded_cache_in_a_jvm_keeping_every_cpu_busy_is_a_bound_between_two_histograms(
    memdiag, java, tmp_path, jfr_start_unmeasured
):
    w = java("LruCache", "1000", "4000", str(CPUS), jvm=["-Xmx1g"])
    rep = diagnose(memdiag, tmp_path, w.pid, *DEFAULTS)
    v = rep["verdict"]
    assert trail(rep, "budget", "jfr")[0]["state"] == "over-budget"
    if trail(rep, "probe", "histogram"):
        assert v["kind"] == "cache" and v["rule"] == "java-heap-class-bounded", v["summary"]
        assert "between two class histograms" in v["summary"], v["summary"]
    else:  # no rule asked (the heap did not grow in the window): never growth, never a leak
        assert v["kind"] not in ("growth", "leak"), v["summary"]
    assert not jfr_threads(w.pid) and left_in_jvm(w.pid) == []


def test_over_every_price_the_counters_say_growth_and_nothing_is_sent_to_the_jvm(memdiag, java, tmp_path):
    w = java("OrderService", "1000", jvm=["-Xmx512m"])
    rep = diagnose(memdiag, tmp_path, w.pid, "--duration", "30", "--budget", "0.01")
    v = rep["verdict"]
    assert v["kind"] == "growth" and v["rule"] == "java-heap-growth-unnamed", v["summary"]
    assert "the flight recorder would say" in v["summary"] and "budget" in v["summary"]
    assert trail(rep, "budget", "jfr")[0]["state"] == "over-budget" and not trail(rep, "probe", "jfr")
    assert trail(rep, "budget", "histogram")[0]["state"] == "over-budget", trail(rep, "budget", "histogram")
    assert not trail(rep, "probe", "histogram")
    assert not jfr_threads(w.pid)  # no recording was ever started in it
    assert not Path(f"/tmp/.java_pid{w.pid}").exists()  # no command sent: its attach listener never started
    assert left_in_jvm(w.pid) == []


def test_a_jvm_refusing_attach_is_diagnosed_from_its_counters_and_never_signalled(memdiag, java, tmp_path):
    w = java("OrderService", "1000", jvm=["-Xmx512m", "-XX:+DisableAttachMechanism"])
    rep = diagnose(memdiag, tmp_path, w.pid)
    v = rep["verdict"]
    assert v["kind"] == "growth" and "growth in the Java heap" in v["summary"], v["summary"]
    plan = trail(rep, "budget", "jfr")[0]
    assert plan["state"] == "refused" and "-XX:+DisableAttachMechanism" in plan["reason"]
    assert w.proc.poll() is None and not Path(f"/tmp/.java_pid{w.pid}").exists()


def test_sigterm_mid_recording_stops_it_and_removes_its_files(java, tmp_path):
    w = java("OrderService", "1000", jvm=["-Xmx512m"])
    wait_warmed_up(w.pid)
    cmd = [MEMDIAG, "--pid", str(w.pid), *WINDOW, "--output", str(tmp_path)]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        wait_until(lambda: bool(recordings_running(w.pid)), "the recording to start", timeout=60)
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    rep = read_report(tmp_path)
    assert rep["interrupted"]["signal"] == "SIGTERM"
    assert recordings_running(w.pid) == [] and left_in_jvm(w.pid) == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not H2_JAR.exists(), reason="needs Debian's libh2-java (scripts/setup.sh --test)")
def test_a_real_h2_database_server_keeping_every_row_is_growth_held_by_its_own_code(memdiag, java, tmp_path):
    """Debian's H2 database engine as a TCP server, its in-memory table fed by a client JVM."""
    port = free_port()
    server = java(
        "org.h2.tools.Server",
        "-tcp",
        "-tcpPort",
        str(port),
        "-ifNotExists",
        jvm=["-Xmx512m"],
        classpath=[str(H2_JAR)],
        ready="TCP server running",
    )
    # old-object samples are taken as threads refill their allocation buffers: a few MiB/s of rows
    # gives the recording some tens of them
    java("H2Feeder", f"jdbc:h2:tcp://localhost:{port}/mem:orders", "2000", "2048", classpath=[str(H2_JAR)])
    rep = diagnose(memdiag, tmp_path, server.pid, *DEFAULTS)  # as a user would: no option
    v = rep["verdict"]
    assert v["kind"] == "growth" and "growth in the Java heap" in v["summary"], v["summary"]
    assert v["rule"] in ("java-heap-retained", "java-heap-growth-unnamed"), v["rule"]
    # partial: where what the server paid passed the budget, the recording stopped early
    assert next(p for p in rep["probes"] if p["name"] == "jfr")["status"] in ("ok", "partial")
    # what H2's own code allocates (past the JDK's frames); what holds it where the JVM's old-object
    # sampler kept some (a few MiB/s of rows gives a 20 s recording 0 to some tens of samples)
    allocating = section(rep, "Java heap: what allocates")["rows"]
    assert any(row[1].startswith("org.h2.") for row in allocating[:3]), allocating
    holders = section(rep, "Java heap: what holds it")["rows"]
    assert all(row[1].startswith("org.h2.") for row in holders[:1]), holders
    assert left_in_jvm(server.pid) == []


def test_a_jvm_in_a_podman_container_is_diagnosed_by_container_name(memdiag, jvm_container, tmp_path):
    c = jvm_container("OrderService", "1000", jvm=("-Xmx512m",))
    wait_warmed_up(c.pid)
    r = memdiag("--container", c.name, *WINDOW, "--output", str(tmp_path), timeout=240)
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "report.json").read_text())
    v = rep["verdict"]
    assert v["kind"] == "growth" and v["rule"] == "java-heap-retained", v["summary"]
    assert "held by OrderService.retryQueue" in v["summary"] and c.name in rep["target"]["description"]
    how = section(rep, "Java heap: what holds it")["lines"][0]
    assert "this host's JDK" in how and "/usr/lib/jvm/" in how  # the host's jfr, never the container's
    assert Path(f"/proc/{c.pid}/root/tmp/.java_pid1").exists()  # its listener, under its own pid 1
    assert left_in_jvm(c.pid) == [] and not list(Path(f"/proc/{c.pid}/root/tmp").glob(".attach_pid*"))
