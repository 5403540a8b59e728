"""The class histogram probe's pure parts: GC.class_histogram's table read, the classes that grew
between two looks, the price of a look by the heap in use, its facts, and the playbook's verdicts
from them (the flight recording over the budget, the histograms' in its place)."""

from __future__ import annotations

import pytest
from memdiag.diagnose.workflow import load_rules
from memdiag.probes.jvm import costs
from memdiag.probes.jvm.histogram import FACE, HistogramPlan, HistogramResult, grown, parse_histogram
from memdiag.rules.engine import run_rules
from test_jvm_facts import BASE, jvm_facts, leaking, verdict

MiB = 1 << 20
# OpenJDK 17's answer, cut: the JVM prints each class once per loader, hidden classes with their address
ANSWER = """\
 num     #instances         #bytes  class name (module)
-------------------------------------------------------
   1:          3911       64323072  [B (java.base@17.0.15)
   2:         12004         288096  java.lang.String (java.base@17.0.15)
   3:          4000         192000  java.util.LinkedHashMap$Entry (java.base@17.0.15)
   4:           900          43200  [Ljava.lang.Object; (java.base@17.0.15)
   5:             2             96  java.lang.invoke.LambdaForm$MH/0x0000000800c0c400 (java.base@17.0.15)
   6:             1             48  OrderService
Total         20818       64846512
"""


def test_the_table_is_read_with_javas_names_and_the_jvms_totals():
    h = parse_histogram(ANSWER)
    assert h is not None and h.bytes == 64846512 and h.instances == 20818
    assert h.classes["byte[]"] == (3911, 64323072) and h.classes["java.lang.Object[]"] == (900, 43200)
    assert h.classes["OrderService"] == (1, 48)  # a class of the program's own, no module
    assert "java.lang.invoke.LambdaForm$MH/0x0000000800c0c400" in h.classes  # a hidden class kept whole
    assert parse_histogram("java.lang.IllegalArgumentException: Unknown diagnostic command") is None
    assert parse_histogram("") is None


def test_the_classes_that_grew_most_first_a_new_one_included():
    first = parse_histogram(ANSWER)
    later = ANSWER.replace("3911       64323072", "7200      118423552").replace(
        "   6:             1             48  OrderService",
        "   6:             1             48  OrderService\n   7:           500          24000  Order",
    )
    last = parse_histogram(later)
    assert first is not None and last is not None
    g = grown(first, last)
    assert [c.cls for c in g] == ["byte[]", "Order"]  # what shrank or stayed is not growth
    assert g[0].grew == 118423552 - 64323072 and g[0].added == 7200 - 3911
    assert g[1].bytes_first == 0 and g[1].added == 500


def test_a_look_is_priced_per_gib_never_below_the_floor_and_the_old_figures_are_not_read(tmp_path, monkeypatch):
    monkeypatch.setattr(costs, "STORE", tmp_path / "jvm-costs.json")
    # what an earlier memdiag kept (its second look counted the young collections between the looks)
    costs.STORE.write_text('{"17": {"histogram_cpu_per_gib": [3.2, 3.2], "histogram_pause_per_gib": [0.5]}}')
    big = costs.histogram_price("17", 2 << 30)
    assert not big.measured_here
    assert big.cpu_s == pytest.approx(2 * costs.HISTOGRAM_PRIORS["look_cpu_per_gib"])
    assert costs.histogram_price("17", 1 << 20).pause_s == costs.HISTOGRAM_FLOOR_S  # a tiny heap: the floor
    costs.remember("17", {"look_cpu_per_gib": 0.1, "look_pause_per_gib": 0.05})
    mine = costs.histogram_price("17", 2 << 30)
    assert mine.measured_here and mine.cpu_s == pytest.approx(0.2) and mine.pause_s == pytest.approx(0.1)
    assert not costs.histogram_price("11", 2 << 30).measured_here  # another build: its own figures, none yet


def result(first: int, last: int) -> HistogramResult:
    a = parse_histogram(ANSWER)
    b = parse_histogram(ANSWER.replace("3911       64323072", f"7200  {last - (64846512 - 64323072)}"))
    assert a is not None and b is not None
    return HistogramResult(
        name="histogram", status="ok", looked_at=[100.0, 126.0], live_first=first, live_last=last,
        classes=grown(a, b), pauses_s=[0.03, 0.05], look_cpu_s=[0.05, 0.06], measured_ns=1.1e8,
    )  # fmt: skip


def test_its_facts_say_what_grew_by_how_much_and_how_fast():
    r = result(64846512, 64846512 + 52 * MiB)
    f = FACE.facts_of(r, HistogramPlan(go=True, state="full", reason="", facts={"histogram.plan": "full"}), None)
    assert set(f) <= FACE.fact_names()
    assert f["histogram.top_class"] == "byte[]" and f["histogram.top_grew"] == 52 * MiB
    assert f["histogram.top_share"] == pytest.approx(100) and f["histogram.apart"] == 26.0
    assert f["histogram.top_rate"] == pytest.approx(52 * MiB / 26) and f["histogram.pause"] == 0.05
    assert f["histogram.live_growth"] == pytest.approx(100 * 52 * MiB / 64846512)
    # a partial run (the target left before the second look) yields no growth facts, only its plan's
    gone = r.model_copy(update={"status": "partial", "live_last": None})
    assert FACE.facts_of(gone, None, None) == {}
    (sec,) = FACE.sections(r)
    assert sec.rows[0][0] == "byte[]" and "full collection" in sec.lines[0]


OVER = "its price is over the budget (the trail says by how much): a larger --budget or a longer --duration pays for it"


def test_the_playbook_asks_for_histograms_when_the_recording_is_over_the_budget_and_reads_them():
    counters = {**BASE, **jvm_facts(leaking()), "jfr.plan": "over-budget", "jfr.not_run": OVER}
    outcomes = run_rules(load_rules(), counters)
    asked = [r.id for r, o in outcomes if o.state == "fired" and any(p.name == "histogram" for p in r.then.probes)]
    assert asked == ["java-heap-by-class"]
    assert verdict(counters) == "java-heap-growth-unnamed"  # before the histograms: the counters alone
    grows = {**counters, **FACE.facts_of(result(64846512, 64846512 + 52 * MiB), None, None)}
    assert verdict(grows) == "java-heap-class-grows"
    # the live objects at the second look within 5% of the first: a bound, whatever the live set's trend
    bounded = {**counters, **FACE.facts_of(result(64846512, 64846512 + MiB), None, None)}
    assert verdict(bounded) == "java-heap-class-bounded"
    # a recording that named the holder outranks the histograms
    named = {**grows, "jfr.held_anchor": "OrderService.retryQueue", "jfr.held_kept": 100.0}
    assert verdict(named) == "java-heap-retained"


def test_without_a_trusted_jfr_on_the_host_the_histograms_name_the_class_and_say_why():
    from memdiag.probes.jvm.tool import NO_TRUSTED_JFR

    counters = {**BASE, **jvm_facts(leaking()), "jfr.plan": "no-tool", "jfr.not_run": NO_TRUSTED_JFR}
    outcomes = run_rules(load_rules(), counters)
    asked = [r.id for r, o in outcomes if o.state == "fired" and any(p.name == "histogram" for p in r.then.probes)]
    assert asked == ["java-heap-by-class"]
    grows = {**counters, **FACE.facts_of(result(64846512, 64846512 + 52 * MiB), None, None)}
    assert verdict(grows) == "java-heap-class-grows"
    # an attach refused outright (-XX:+DisableAttachMechanism) asks for no histogram: it would attach too
    refused = {**counters, "jfr.plan": "refused"}
    fired = [r.id for r, o in run_rules(load_rules(), refused) if o.state == "fired"]
    assert "java-heap-by-class" not in fired
