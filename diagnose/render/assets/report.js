/* memdiag's report.html: draws the page's JSON (#memdiag-data) with uPlot and d3-flame-graph.
 * Every name in the data is the target's: it is only ever set as text (textContent, SVG <title>),
 * never as HTML. window.memdiag holds the chart and the flame graph, for a reader's console and tests. */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("memdiag-data").textContent);
  var memdiag = (window.memdiag = { data: data });
  var UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

  function bytes(v) {
    if (v == null) return "--";
    var a = Math.abs(v), i = 0;
    while (a >= 1024 && i < UNITS.length - 1) { a /= 1024; i++; }
    return (v < 0 ? "-" : "") + (i ? a.toFixed(1) : String(Math.round(a))) + " " + UNITS[i];
  }
  function amount(v) {
    return data.unit === "bytes" ? bytes(v) : Number(v).toLocaleString("en") + " " + data.unit;
  }
  var COLORS = ["#222222", "#b3261e", "#1565c0", "#2e7d32", "#d35400", "#7b1fa2", "#00838f", "#6d4c41", "#c2185b",
                "#5d4037", "#455a64", "#9e9d24"];

  // one chart of aligned series: x in seconds, every line in bytes
  function drawChart(id, chart) {
    var el = document.getElementById(id);
    if (!el || !chart) return null;
    var xlabel = chart.xlabel || "seconds into the window";
    var series = [{ label: xlabel, value: function (u, v) { return v == null ? "--" : v.toFixed(1) + " s"; } }];
    chart.series.forEach(function (s, i) {
      series.push({
        label: s.label,
        stroke: s.kind === "limit" ? "#b3261e" : COLORS[i % COLORS.length],
        width: s.kind === "total" ? 2.5 : 1.5,
        dash: s.kind === "stack" ? [6, 4] : s.kind === "runtime" ? [2, 3] : s.kind === "limit" ? [10, 5] : undefined,
        spanGaps: true,
        points: { show: s.kind === "stack" },
        value: function (u, v) { return bytes(v); },
      });
    });
    var opts = {
      width: Math.max(600, el.clientWidth || 1000),
      height: 340,
      scales: { x: { time: false } },
      series: series,
      axes: [
        { label: xlabel },
        { size: 80, values: function (u, vals) { return vals.map(bytes); } },
      ],
    };
    var columns = [chart.x].concat(chart.series.map(function (s) { return s.values; }));
    return new uPlot(opts, columns, el);
  }

  function drawFlame() {
    var el = document.getElementById("flame-graph");
    if (!el || !data.flame) return;
    var total = data.flame.value;
    var details = document.getElementById("flame-details");
    var chart = flamegraph()
      .width(Math.max(600, el.clientWidth || 1000))
      .cellHeight(18)
      .minFrameSize(2)
      .transitionDuration(250)
      .title("")
      .sort(true)
      .label(function (d) {
        return d.data.name + ": " + amount(d.value) + " (" + (100 * d.value / total).toFixed(1) + "% of " +
          amount(total) + "), in " + d.data.stacks + " stack" + (d.data.stacks === 1 ? "" : "s");
      })
      // a plain substring, any case: a function's name is no regular expression
      .setSearchMatch(function (d, term) {
        return !!term && d.data.name.toLowerCase().indexOf(String(term).toLowerCase()) >= 0;
      })
      .setDetailsElement(details)
      .setSearchHandler(function (results, sum, all) {
        details.textContent = results.length
          ? "search: " + results.length + " frame(s), " + amount(sum) + " of " + amount(all) +
            " (" + (100 * sum / all).toFixed(1) + "%)"
          : "search: nothing found";
      });
    d3.select(el).datum(data.flame).call(chart);
    memdiag.flame = chart;
    var input = document.getElementById("flame-search");
    input.addEventListener("input", function () {
      if (input.value) chart.search(input.value); else chart.clear();
    });
    document.getElementById("flame-reset").addEventListener("click", function () { chart.resetZoom(); });
  }

  memdiag.scene = drawChart("scene-chart", data.scene);
  memdiag.chart = drawChart("memory-chart", data.chart);
  drawFlame();
})();
