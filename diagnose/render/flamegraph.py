"""growth.svg: a flame graph of memory growth from folded stacks (root at the bottom, width =
bytes or pages), self-contained SVG with a tooltip per frame."""

from __future__ import annotations

import html
import zlib

from .text import one_line

WIDTH, ROW, FONT = 1200, 17, 11


def _tree(folded: list[str]) -> dict:
    root: dict = {"n": 0, "c": {}}
    for line in folded:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        root["n"] += n
        node = root
        for frame in stack.split(";"):
            node = node["c"].setdefault(frame, {"n": 0, "c": {}})
            node["n"] += n
    return root


def _color(name: str) -> str:
    h = zlib.crc32(name.encode())
    return f"rgb({205 + h % 50},{80 + (h >> 8) % 120},{40 + (h >> 16) % 40})"


def render_flamegraph(folded: list[str], title: str) -> str:
    root = _tree(folded)
    if not root["n"]:
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="60"><text x="10" y="30" '
            f'font-family="sans-serif" font-size="14">{html.escape(one_line(title))}: no stacks recorded</text></svg>\n'
        )
    rects: list[str] = []
    depth_max = 0

    def walk(node: dict, name: str, x: float, depth: int) -> None:
        nonlocal depth_max
        depth_max = max(depth_max, depth)
        w = WIDTH * node["n"] / root["n"]
        if w < 0.5:
            return
        rects.append((name, x, depth, w, node["n"]))  # type: ignore[arg-type]
        cx = x
        for child_name, child in sorted(node["c"].items()):
            walk(child, child_name, cx, depth + 1)
            cx += WIDTH * child["n"] / root["n"]

    x = 0.0
    for name, child in sorted(root["c"].items()):
        walk(child, name, x, 0)
        x += WIDTH * child["n"] / root["n"]
    height = (depth_max + 1) * ROW + 40
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="monospace" '
        f'font-size="{FONT}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="14">{html.escape(one_line(title))}</text>',
    ]
    for raw, x, depth, w, n in rects:  # type: ignore[misc]
        y = height - (depth + 1) * ROW
        name = one_line(raw)  # a frame's name is the target's: no control or bidi character drawn as is
        label = html.escape(name)
        pct = 100.0 * n / root["n"]
        chars = int(w / (FONT * 0.62))
        text = label if len(name) <= chars else (html.escape(name[: max(chars - 2, 0)]) + ".." if chars > 3 else "")
        out.append(
            f'<g><title>{label} ({n:,}, {pct:.1f}%)</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
            f'height="{ROW - 1}" fill="{_color(name)}" rx="2"/><text x="{x + 3:.1f}" y="{y + ROW - 5}">'
            f"{text}</text></g>"
        )
    out.append("</svg>\n")
    return "\n".join(out)
