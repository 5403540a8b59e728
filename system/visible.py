"""Text a target chose (a comm, a file name, a symbol) made visible: every control character written
as an escape, so one value stays one line wherever it is shown (a rule's summary, a table cell, a
terminal). The one home of that escaping: diagnose/render/text.py builds its prose and code spans on
it, and a string fact is shown through it (system/units.format_quantity)."""

from __future__ import annotations

import re

# Unicode's format characters (category Cf, Unicode 14): invisible, and the bidirectional ones among
# them (U+202A-202E embeddings and overrides, U+2066-2069 isolates, U+200E/200F marks) reorder the
# text shown around them, so a comm or argument could make a report line read as something else
# (U+202E turned "exe.txt" around). Written out as ranges: a class built from unicodedata at import
# walks 1.1 million code points. tests/unit/test_render_text.py checks it against the running Python's.
FORMAT_CHARS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
# C0 controls (ESC among them), DEL, the C1 controls (CSI \x9b and OSC \x9d start terminal sequences
# on their own), what Unicode treats as a line break (NEL is C1; LINE/PARAGRAPH SEPARATOR), and the
# format characters
_CONTROL = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{FORMAT_CHARS}]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def one_line(text: str) -> str:
    """Every control character as a visible escape (a newline becomes the two characters \\n)."""
    return _CONTROL.sub(lambda m: _NAMED.get(m.group()) or _escape(m.group()), text)


def _escape(char: str) -> str:
    """A character as Python writes it in a string literal: \\x1b, \\u202e, \\U000e0001."""
    n = ord(char)
    return f"\\x{n:02x}" if n <= 0xFF else f"\\u{n:04x}" if n <= 0xFFFF else f"\\U{n:08x}"
