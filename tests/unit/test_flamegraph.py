"""growth.svg from folded stacks: one box per frame per path, widths in proportion."""

import re

from memdiag.diagnose.render.flamegraph import WIDTH, render_flamegraph


def test_boxes_and_widths():
    svg = render_flamegraph(["main;leak;malloc 30", "main;churn;malloc 10"], title="t")
    titles = re.findall(r"<title>([^<]+)</title>", svg)
    assert titles == [
        "main (40, 100.0%)",
        "churn (10, 25.0%)",
        "malloc (10, 25.0%)",
        "leak (30, 75.0%)",
        "malloc (30, 75.0%)",
    ]
    widths = [float(w) for w in re.findall(r'<rect x="[0-9.]+" y="[0-9]+" width="([0-9.]+)"', svg)]
    assert widths[0] == WIDTH and widths[1] == WIDTH / 4


def test_empty_says_so():
    assert "no stacks recorded" in render_flamegraph([], title="t")
