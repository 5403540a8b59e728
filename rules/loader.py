"""Load playbook files strictly: every error comes back with file:line and what is wrong; ids must
be unique across all files; the shipped playbook first, then playbooks/ of the working tree and
--playbook paths."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

import yaml
from pydantic import ValidationError

from .model import Playbook, Rule


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
        raise RuleFileError([f"{path}:1: empty file (expected `rules:` with a list of rules)"])
    lines: dict[tuple, int] = {}
    try:
        data = _to_python(node, (), lines)
    except RuleFileError as e:
        raise RuleFileError([f"{path}{m}" for m in e.errors]) from None
    errors: list[str] = []
    if not isinstance(data, dict) or set(data) != {"rules"} or not isinstance(data["rules"], list):
        raise RuleFileError([f"{path}:1: a playbook is a mapping with one key, `rules`, holding a list of rules"])
    rules: list[Rule] = []
    for i, raw in enumerate(data["rules"]):
        try:
            rule = Rule.model_validate(raw)
        except ValidationError as e:
            for err in e.errors():
                loc = ("rules", i, *err["loc"])
                where = ".".join(str(p) for p in err["loc"] if not str(p).startswith(("function-", "AllOf", "AnyOf")))
                msg = err["msg"].removeprefix("Value error, ")
                if err["type"] == "extra_forbidden":
                    msg = f"unknown key `{err['loc'][-1]}`"
                    where = ".".join(str(p) for p in err["loc"][:-1])
                errors.append(
                    f"{path}:{_line_of(loc, lines)}: rule {raw.get('id', i) if isinstance(raw, dict) else i}"
                    f"{' ' + where if where else ''}: {msg}"
                )
            continue
        rules.append(rule.model_copy(update={"source": f"{path}:{lines.get(('rules', i), 1)}"}))
    if errors:
        raise RuleFileError(errors)
    return rules


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
    errors: list[str] = []
    rules: list[Rule] = []
    first: dict[str, str] = {}
    for path in paths:
        try:
            loaded = load_file(path)
        except RuleFileError as e:
            errors += e.errors
            continue
        for rule in loaded:
            if rule.id in first:
                errors.append(f"{rule.source}: duplicate rule id `{rule.id}` (first defined at {first[rule.id]})")
                continue
            first[rule.id] = rule.source
            rules.append(rule)
    if errors:
        raise RuleFileError(errors)
    Playbook(rules=rules)  # the whole set validates as one playbook
    return rules
