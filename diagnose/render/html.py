"""report.html: the Markdown report rendered by markdown-it-py, self-contained (inline style)."""

from __future__ import annotations

import html

from markdown_it import MarkdownIt

from .text import one_line

_STYLE = """
body{font:15px/1.5 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}
th{background:#f3f3f3}code{background:#f5f5f5;padding:0 3px}h1{font-size:1.5em}h2{border-bottom:1px solid #ddd}
"""


def render_html(markdown_text: str, title: str) -> str:
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown_text)
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(one_line(title))}</title>'
        f"<style>{_STYLE}</style></head><body>\n{body}</body></html>\n"
    )
