"""Load playbook files strictly: every error comes back with file:line and what is wrong; ids must
be unique across all files. Policy is the shipped playbook, then the site folder, then --playbook
paths (memdiag.rules.source says where policy may come from and reads the bytes, bounded).

YAML is composed (never constructed) after one pass over its events that refuses deep nesting,
long scalars and aliases that expand past a small budget of nodes and bytes: a billion-laughs file
fails at its first big alias. Scalars are typed by the YAML 1.2 core schema, by memdiag: str, int,
float, bool, null, nothing else (no YAML 1.1 base-60 numbers, timestamps, yes/no), so no scalar can
cost more than its length or fail anywhere but here, with its line."""

from __future__ import annotations

import difflib
import math
import os
import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from .model import FrameClass, Playbook, Rule
from .source import Errors, RuleFileError, folder_entries, is_shipped, read_rule_file, shipped_dir, site_dir

__all__ = [
    "RuleFileError",
    "load_file",
    "load_file_parts",
    "load_playbook",
    "load_playbooks",
    "playbook_paths",
    "shipped_playbooks",
]

MAX_DEPTH = 64  # the shipped playbook nests 10 deep
MAX_NODES = 20_000  # written in one file: the shipped playbook has 634; a composed node costs ~0.5 KiB
MAX_ALIAS_NODES = 10_000  # nodes aliases may add: an anchor reused a few times, never a bomb
MAX_ALIAS_BYTES = 1 << 20  # scalar bytes aliases may add: an error names a rule by its id, once per error
MAX_SCALAR = 64 << 10  # a rule's longest text is a line or two
MAX_NUMBER = 100  # characters of a number: a priority, a confidence

_PLAIN = "tag:memdiag,2026:plain"  # an untagged plain scalar, typed below by the core schema
_TAG = "tag:yaml.org,2002:"
_CORE = {  # YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
    "null": re.compile(r"~|null|Null|NULL|"),
    "bool": re.compile(r"true|True|TRUE|false|False|FALSE"),
    "int": re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+"),
    "float": re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)"),
}


class _Loader(getattr(yaml, "CBaseLoader", yaml.BaseLoader)):  # libyaml when present: the same rules, faster
    """Parses and composes only; an untagged plain scalar keeps the tag _PLAIN for _scalar to type."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN
        return super().resolve(kind, value, implicit)


_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
_NODE = (*_OPEN, yaml.ScalarEvent, yaml.AliasEvent)


def _check_events(text: str) -> None:
    """Refuse, before any tree is built, nesting deeper than MAX_DEPTH, more than MAX_NODES nodes,
    a scalar longer than MAX_SCALAR, and aliases that would add more than MAX_ALIAS_NODES nodes or
    MAX_ALIAS_BYTES bytes of scalars (or that point into their own anchor). One pass, no tree."""
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, scalar bytes) an alias to it stands for
    open_: list[list] = []  # [anchor, nodes so far, bytes so far] of each collection being read
    added = added_bytes = written = 0
    for ev in yaml.parse(text, Loader=_Loader):
        line = ev.start_mark.line + 1 if ev.start_mark else 1
        written += isinstance(ev, _NODE)
        if written > MAX_NODES:
            raise RuleFileError([f":{line}: more than {MAX_NODES} YAML nodes; a playbook has hundreds"])
        if isinstance(ev, _OPEN):
            if len(open_) >= MAX_DEPTH:
                raise RuleFileError([f":{line}: nested deeper than {MAX_DEPTH} levels"])
            open_.append([ev.anchor, 1, 0])
            continue
        if isinstance(ev, _CLOSE):
            anchor, n, size = open_.pop()
        elif isinstance(ev, yaml.ScalarEvent):
            if len(ev.value) > MAX_SCALAR:
                raise RuleFileError([f":{line}: a scalar of {len(ev.value)} characters; at most {MAX_SCALAR}"])
            anchor, n, size = ev.anchor, 1, len(ev.value.encode())
        elif isinstance(ev, yaml.AliasEvent):
            if any(a == ev.anchor for a, _, _ in open_):
                raise RuleFileError([f":{line}: alias `*{ev.anchor}` refers to the node that contains it"])
            anchor, (n, size) = None, sizes.get(ev.anchor, (1, 0))
            added, added_bytes = added + n, added_bytes + size
            if added > MAX_ALIAS_NODES or added_bytes > MAX_ALIAS_BYTES:
                past = f"{MAX_ALIAS_NODES} nodes" if added > MAX_ALIAS_NODES else f"{MAX_ALIAS_BYTES >> 20} MiB"
                raise RuleFileError(
                    [
                        f":{line}: alias `*{ev.anchor}` expands the file past {past} "
                        "(a YAML alias bomb?); an anchor may be reused only a little"
                    ]
                )
        else:
            continue
        if anchor:
            sizes[anchor] = (n, size)
        if open_:
            open_[-1][1] += n
            open_[-1][2] += size


def _to_python(node: yaml.Node, path: tuple, lines: dict[tuple, int]):
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.ScalarNode):
        return _scalar(node.tag, node.value, lines[path])
    if node.tag not in (f"{_TAG}map", f"{_TAG}seq"):
        raise RuleFileError([f":{lines[path]}: the tag `{node.tag}` is not allowed in a rule file"])
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise RuleFileError([f":{key_node.start_mark.line + 1}: a key must be a plain name"])
            key = key_node.value
            if key in out:
                raise RuleFileError([f":{key_node.start_mark.line + 1}: duplicate key `{key}`"])
            out[key] = _to_python(value_node, (*path, key), lines)
        return out
    return [_to_python(v, (*path, i), lines) for i, v in enumerate(node.value)]


def _scalar(tag: str, text: str, line: int):
    """A scalar typed by the YAML 1.2 core schema: an untagged plain one by what it looks like,
    a tagged one (!!str, !!int, !!float, !!bool, !!null) only if it is what its tag says."""
    kind = tag.removeprefix(_TAG) if tag.startswith(_TAG) else None
    looks = "str" if kind == "str" else next((k for k, pattern in _CORE.items() if pattern.fullmatch(text)), "str")
    if tag == _PLAIN:
        kind = looks
    elif kind not in ("str", *_CORE):
        raise RuleFileError([f":{line}: the tag `{tag}` is not allowed in a rule file"])
    elif looks != kind and (kind, looks) != ("float", "int"):
        raise RuleFileError([f":{line}: `{text[:40]}` is not a valid {kind} (tagged !!{kind})"])
    if looks in ("int", "float") and len(text) > MAX_NUMBER:
        raise RuleFileError([f":{line}: a number of {len(text)} characters; at most {MAX_NUMBER}"])
    if kind == "null":
        return None
    if kind == "bool":
        return text.lower() == "true"
    if looks == "int":  # an int, or an int tagged !!float
        base = {"0o": 8, "0x": 16}.get(text[:2], 10)
        number = int(text[2:] if base != 10 else text, base)
        return float(number) if kind == "float" else number
    if kind == "float":
        low = text.lower()
        return math.nan if low == ".nan" else float(low.replace(".inf", "inf"))
    return text


def _short(name: object) -> str:
    """A rule's name as errors show it: an id of 64 KiB is not repeated in every message."""
    text = str(name)
    return text if len(text) <= 60 else text[:59] + "…"


def _line_of(loc: tuple, lines: dict[tuple, int]) -> int:
    loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith(("function-", "AllOf", "AnyOf"))))
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def load_file(path: Path, trusted: bool = True) -> list[Rule]:
    return load_file_parts(path, trusted).rules


def _yaml_error(path: Path, text: str, e: yaml.YAMLError) -> RuleFileError:
    if isinstance(e, yaml.reader.ReaderError):  # a character YAML does not allow: its line, one line
        line = text.count("\n", 0, e.position) + 1
        code = e.character if isinstance(e.character, int) else ord(e.character)
        return RuleFileError([f"{path}:{line}: not valid YAML: character U+{code:04X}: {e.reason}"])
    mark, context = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
    line = mark.line + 1 if mark else 1
    where = ""
    if context is not None and getattr(e, "context", None):
        where = f" ({e.context.removeprefix('while parsing ')} on line {context.line + 1})"
    return RuleFileError([f"{path}:{line}: not valid YAML: {getattr(e, 'problem', None) or e}{where}"])


def _parse(path: Path, text: str) -> tuple[object, dict[tuple, int]]:
    """The document as plain Python, and the line of every node (by its path of keys and indexes)."""
    lines: dict[tuple, int] = {}
    try:
        _check_events(text)
        node = yaml.compose(text, Loader=_Loader)
        if node is None:
            raise RuleFileError([":1: empty file (expected `rules:` with a list of rules, or `wrappers:`)"])
        return _to_python(node, (), lines), lines
    except yaml.YAMLError as e:
        raise _yaml_error(path, text, e) from None
    except RuleFileError as e:
        raise RuleFileError([f"{path}{m}" for m in e.errors]) from None


def load_file_parts(path: Path, trusted: bool = True) -> Playbook:
    """One file's rules and wrappers (either section may be absent, not both). trusted: refuse the
    file unless it is trusted policy (the shipped files always are); False only to lint it."""
    text = read_rule_file(path, trusted=trusted and not is_shipped(path))
    data, lines = _parse(path, text)
    if (
        not isinstance(data, dict)
        or not data
        or not set(data) <= {"rules", "wrappers"}
        or not all(isinstance(v, list) for v in data.values())
    ):
        raise RuleFileError(
            [f"{path}:1: a playbook is a mapping with `rules` (a list of rules) and/or `wrappers` (a list of frames)"]
        )
    errors = Errors()
    rules: list[Rule] = []
    for i, raw in enumerate(data.get("rules", [])):
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as e:
            name = raw.get("id", i) if isinstance(raw, dict) else i
            _errors(errors, path, ("rules", i), f"rule {_short(name)}", e, lines)
            continue
        rules.append(rule.model_copy(update={"source": f"{path}:{lines.get(('rules', i), 1)}"}))
    wrappers: list[FrameClass] = []
    for i, raw in enumerate(data.get("wrappers", [])):
        try:
            entry = FrameClass.model_validate(raw)
        except ValidationError as e:
            _errors(errors, path, ("wrappers", i), f"wrappers entry {i + 1}", e, lines)
            continue
        wrappers.append(entry.model_copy(update={"source": f"{path}:{lines.get(('wrappers', i), 1)}"}))
    errors.raise_any()
    return Playbook(rules=rules, wrappers=wrappers)


def _errors(errors: Errors, path: Path, at: tuple, what: str, e: ValidationError, lines: dict[tuple, int]) -> None:
    """Each validation error of one list item as 'file:line: what where: message'; only counted
    once errors holds as many as are shown."""
    if errors.full:
        errors.count(e.error_count())
        return
    out = []
    for err in e.errors():
        loc = (*at, *err["loc"])
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "AllOf", "AnyOf")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key `{err['loc'][-1]}`"
            where = ".".join(str(p) for p in err["loc"][:-1])
        out.append(f"{path}:{_line_of(loc, lines)}: {what}{' ' + where if where else ''}: {msg}")
    errors.add(out)


def shipped_playbooks() -> list[Path]:
    return sorted(shipped_dir().glob("*.yaml"))


def named_paths(given: list[Path], trusted: bool) -> list[Path]:
    """Exactly the files named, and the *.yaml of the folders named (folders checked for trust
    when trusted; files are checked when they are read)."""
    paths: list[Path] = []
    for p in given:
        if p.is_dir():
            paths += folder_entries(p, trusted=trusted)
        elif os.path.lexists(p):
            paths.append(p)
        else:
            raise RuleFileError([f"{p}: no such file or folder"])
    return paths


def playbook_paths(extra: list[Path] | None = None, site: Path | None = None) -> list[Path]:
    """Policy, in order: the shipped playbook, the site folder's *.yaml (site, default
    $MEMDIAG_PLAYBOOK_DIR or /etc/memdiag/playbooks; absent is fine; a file there named as a
    shipped one, default.yaml, replaces it), then the paths given (files, or folders of *.yaml).
    Never the working folder's playbooks/ unless it is given. Folders are checked for trust here,
    files when they are read (load_playbook)."""
    paths = shipped_playbooks()
    site = site_dir() if site is None else site
    if os.path.lexists(site):
        entries = folder_entries(site, trusted=True)
        # a site file named as a shipped one replaces it (as /etc overrides /usr/lib for systemd
        # units): an edited copy of default.yaml changes a shipped threshold or precedence
        replaced = {p.name for p in entries}
        paths = [p for p in paths if p.name not in replaced] + entries
    paths += named_paths(extra or [], trusted=True)
    seen, unique = set(), []
    for p in paths:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def _shipped_beside(paths: list[Path]) -> list[Rule]:
    """The shipped rules a file linted alone may name, and whose ids it must not take (a diagnosis
    loads them first), but for those of a shipped file it would replace (a file of the same name)."""
    loaded = {p.resolve() for p in paths}
    names = {p.name for p in paths}
    return [
        r
        for p in shipped_playbooks()
        if p.resolve() not in loaded and p.name not in names
        for r in load_file_parts(p).rules
    ]


_HOW_TO_CHANGE = "; to change a shipped rule, edit a copy of its file under the same name in the site folder"


def _collisions(rules: list[Rule], beside: list[Rule]) -> list[str]:
    shipped = {r.id: r.source for r in beside}
    return [
        f"{r.source}: duplicate rule id `{_short(r.id)}` (shipped at {shipped[r.id]}{_HOW_TO_CHANGE})"
        for r in rules
        if r.id in shipped
    ]


def _because_errors(rules: list[Rule], beside: list[Rule]) -> list[str]:
    """A verdict's `because` names rules of the loaded set (or the shipped ones beside a file linted
    alone) that have a finding to quote."""
    by_id = {r.id: r for r in beside} | {r.id: r for r in rules}
    out = []
    for rule in rules:
        for name in rule.then.verdict.because if rule.then.verdict else []:
            quoted = by_id.get(name)
            if quoted is None:
                close = difflib.get_close_matches(name, by_id, n=1)
                hint = f"; did you mean `{close[0]}`?" if close else ""
                out.append(f"{rule.source}: rule {_short(rule.id)} verdict.because: no rule `{_short(name)}`{hint}")
            elif not quoted.then.finding:
                out.append(
                    f"{rule.source}: rule {_short(rule.id)} verdict.because: rule `{_short(name)}` "
                    f"has no finding to quote ({quoted.source})"
                )
    return out


def load_playbooks(paths: list[Path], trusted: bool = True) -> list[Rule]:
    """All rules of these files; every error of every file reported together."""
    return load_playbook(paths, trusted).rules


def load_playbook(paths: list[Path], trusted: bool = True) -> Playbook:
    """All rules and wrappers of these files as one playbook; every error of every file reported
    together. A site's wrappers add to the shipped ones. trusted=False only lints (rules check)."""
    errors = Errors()
    rules: list[Rule] = []
    wrappers: list[FrameClass] = []
    first: dict[str, str] = {}
    for path in paths:
        try:
            loaded = load_file_parts(path, trusted)
        except RuleFileError as e:
            errors.add(e.errors, e.more)
            continue
        wrappers += loaded.wrappers
        for rule in loaded.rules:
            if rule.id in first:
                how = _HOW_TO_CHANGE if is_shipped(Path(first[rule.id].rsplit(":", 1)[0])) else ""
                errors.add(
                    [f"{rule.source}: duplicate rule id `{_short(rule.id)}` (first defined at {first[rule.id]}{how})"]
                )
                continue
            first[rule.id] = rule.source
            rules.append(rule)
    beside = _shipped_beside(paths)
    errors.add(_collisions(rules, beside) + _because_errors(rules, beside))
    errors.raise_any()
    return Playbook(rules=rules, wrappers=wrappers)  # the whole set validates as one playbook
