"""Load playbook files strictly: every error comes back with file:line and what is wrong; ids must
be unique across all files; the shipped playbook first, then playbooks/ of the working tree and
--playbook paths."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml
from pydantic import ValidationError

from .model import FrameClass, Playbook, Rule


class RuleFileError(Exception):
    """One or more errors in rule files, each as 'file:line: message'."""

    def __init__(self, errors: list[str]):
        super().__init__("\n".join(errors))
        self.errors = errors


def _to_python(node: yaml.Node, path: tuple, lines: dict[tuple, int]):
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out = {}
        for key_node, value_node in node.value:
            key = key_node.value
            if key in out:
                raise RuleFileError([f":{key_node.start_mark.line + 1}: duplicate key `{key}`"])
            out[key] = _to_python(value_node, (*path, key), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, (*path, i), lines) for i, v in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))  # a scalar, typed as YAML types it


def _line_of(loc: tuple, lines: dict[tuple, int]) -> int:
    loc = tuple(p for p in loc if not (isinstance(p, str) and p.startswith(("function-", "AllOf", "AnyOf"))))
    while loc and loc not in lines:
        loc = loc[:-1]
    return lines.get(loc, 1)


def load_file(path: Path) -> list[Rule]:
    return load_file_parts(path).rules


def load_file_parts(path: Path) -> Playbook:
    """One file's rules and wrappers (either section may be absent, not both)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise RuleFileError([f"{path}: cannot read ({e.strerror or e})"]) from None
    try:
        node = yaml.compose(text)
    except yaml.YAMLError as e:
        mark, context = getattr(e, "problem_mark", None), getattr(e, "context_mark", None)
        line = mark.line + 1 if mark else 1
        where = ""
        if context is not None and getattr(e, "context", None):
            where = f" ({e.context.removeprefix('while parsing ')} on line {context.line + 1})"
        raise RuleFileError([f"{path}:{line}: not valid YAML: {getattr(e, 'problem', e)}{where}"]) from None
    if node is None:
        raise RuleFileError([f"{path}:1: empty file (expected `rules:` with a list of rules, or `wrappers:`)"])
    lines: dict[tuple, int] = {}
    try:
        data = _to_python(node, (), lines)
    except RuleFileError as e:
        raise RuleFileError([f"{path}{m}" for m in e.errors]) from None
    if (
        not isinstance(data, dict)
        or not data
        or not set(data) <= {"rules", "wrappers"}
        or not all(isinstance(v, list) for v in data.values())
    ):
        raise RuleFileError(
            [f"{path}:1: a playbook is a mapping with `rules` (a list of rules) and/or `wrappers` (a list of frames)"]
        )
    errors: list[str] = []
    rules: list[Rule] = []
    for i, raw in enumerate(data.get("rules", [])):
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as e:
            name = raw.get("id", i) if isinstance(raw, dict) else i
            errors += _errors(path, ("rules", i), f"rule {name}", e, lines)
            continue
        rules.append(rule.model_copy(update={"source": f"{path}:{lines.get(('rules', i), 1)}"}))
    wrappers: list[FrameClass] = []
    for i, raw in enumerate(data.get("wrappers", [])):
        try:
            entry = FrameClass.model_validate(raw)
        except ValidationError as e:
            errors += _errors(path, ("wrappers", i), f"wrappers entry {i + 1}", e, lines)
            continue
        wrappers.append(entry.model_copy(update={"source": f"{path}:{lines.get(('wrappers', i), 1)}"}))
    if errors:
        raise RuleFileError(errors)
    return Playbook(rules=rules, wrappers=wrappers)


def _errors(path: Path, at: tuple, what: str, e: ValidationError, lines: dict[tuple, int]) -> list[str]:
    """Each validation error of one list item as 'file:line: what where: message'."""
    out = []
    for err in e.errors():
        loc = (*at, *err["loc"])
        where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "AllOf", "AnyOf")))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown key `{err['loc'][-1]}`"
            where = ".".join(str(p) for p in err["loc"][:-1])
        out.append(f"{path}:{_line_of(loc, lines)}: {what}{' ' + where if where else ''}: {msg}")
    return out


def shipped_playbooks() -> list[Path]:
    return sorted(Path(str(files("memdiag.playbooks"))).glob("*.yaml"))


def playbook_paths(extra: list[Path] | None = None, local_dir: Path | None = Path("playbooks")) -> list[Path]:
    """The shipped playbook, then *.yaml in ./playbooks (when it is not the shipped folder), then
    the paths given (files, or folders of *.yaml)."""
    paths = shipped_playbooks()
    shipped = {p.resolve() for p in paths}
    if local_dir is not None and local_dir.is_dir():
        paths += [p for p in sorted(local_dir.glob("*.yaml")) if p.resolve() not in shipped]
    for p in extra or []:
        if p.is_dir():
            paths += sorted(p.glob("*.yaml"))
        elif p.exists():
            paths.append(p)
        else:
            raise RuleFileError([f"{p}: no such file or folder"])
    seen, unique = set(), []
    for p in paths:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            unique.append(p)
    return unique


def load_playbooks(paths: list[Path]) -> list[Rule]:
    """All rules of these files; every error of every file reported together."""
    return load_playbook(paths).rules


def load_playbook(paths: list[Path]) -> Playbook:
    """All rules and wrappers of these files as one playbook; every error of every file reported
    together. A site's wrappers add to the shipped ones."""
    errors: list[str] = []
    rules: list[Rule] = []
    wrappers: list[FrameClass] = []
    first: dict[str, str] = {}
    for path in paths:
        try:
            loaded = load_file_parts(path)
        except RuleFileError as e:
            errors += e.errors
            continue
        wrappers += loaded.wrappers
        for rule in loaded.rules:
            if rule.id in first:
                errors.append(f"{rule.source}: duplicate rule id `{rule.id}` (first defined at {first[rule.id]})")
                continue
            first[rule.id] = rule.source
            rules.append(rule)
    if errors:
        raise RuleFileError(errors)
    return Playbook(rules=rules, wrappers=wrappers)  # the whole set validates as one playbook
