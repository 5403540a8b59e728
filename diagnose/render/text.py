"""Text from outside memdiag (a target's command line and comm, cgroup names, paths, symbols, and the
summaries that quote them) made safe to show, in one place: every string on one line with its control
characters visible (so none can start a heading, a table row, a list or an HTML block in Markdown, nor
move the cursor, recolour or retitle a terminal), prose without markup of its own (no HTML, links or
emphasis), code spans that no backtick can close early."""

from __future__ import annotations

import re
from typing import Any, TypeVar

from memdiag.system.visible import FORMAT_CHARS, one_line
from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)

# What can open markup in prose, and only that (so ordinary text such as "<= 2%" reads as it is):
# an HTML tag or autolink, an entity, an inline link or image, emphasis, a stray backtick, and a
# backslash that would escape what follows. ('|' is left to the table writer, mdtable.py, which
# escapes it in every cell, code spans included.)
_MARKUP = re.compile(r"\\(?=[!-/:-@\[-`{-~]|$)|<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)|(?<=\])\(|\*(?=\S)|`")
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def plain(text: object) -> str:
    """Outside text for a terminal or a plain-text stream: one line, control characters visible
    (ESC shows as the four characters \\x1b). The one function every print of outside text uses."""
    return one_line(str(text))


def json_text(text: str) -> str:
    """JSON text with DEL, the C1 controls, the Unicode line separators and the format characters
    (bidi overrides among them) written as \\u escapes (JSON writers escape only C0): the same
    value, nothing a terminal or a viewer acts on."""
    return _JSON_RAW.sub(lambda m: _json_escape(ord(m.group())), text)


def _json_escape(n: int) -> str:
    """One character as JSON's \\u escape (beyond the BMP, its UTF-16 surrogate pair)."""
    if n <= 0xFFFF:
        return f"\\u{n:04x}"
    n -= 0x10000
    return f"\\u{0xD800 + (n >> 10):04x}\\u{0xDC00 + (n & 0x3FF):04x}"


_JSON_RAW = re.compile(f"[\x7f-\x9f\u2028\u2029{FORMAT_CHARS}]")


def flattened(model: M) -> M:
    """The model with every string in it on one line (nothing else changed)."""
    return type(model).model_validate(_flat(model.model_dump()))


def _flat(value: Any) -> Any:
    if isinstance(value, str):
        return one_line(value)
    if isinstance(value, dict):
        return {k: _flat(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_flat(v) for v in value)
    return value


def prose(text: str) -> str:
    """Text as it reads, without markup of its own: its code spans (`name`) kept, everything else
    that could open HTML, a link, emphasis or a code span backslash-escaped."""
    out, at = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_MARKUP.sub(_escaped, text[at : m.start()]))
        out.append(m.group())
        at = m.end()
    out.append(_MARKUP.sub(_escaped, text[at:]))
    return "".join(out)


def _escaped(m: re.Match) -> str:
    return "\\" + m.group()


def code(text: str) -> str:
    """A code span holding text verbatim, however many backticks it contains."""
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"
