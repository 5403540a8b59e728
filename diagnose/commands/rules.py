"""Rule files: ``memdiag rules check [PATH...]`` validates without running; ``memdiag rules list``
shows what is loaded and from where (``--facts``: every fact a rule may name)."""

from __future__ import annotations

import argparse
from pathlib import Path

from memdiag.rules.catalog import FACTS
from memdiag.rules.loader import RuleFileError, load_playbooks, playbook_paths
from memdiag.rules.units import KIND_NAMES

from ..errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check", "list"])
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="rule files or folders (check: only these; list: in addition to the defaults)",
    )
    parser.add_argument("--facts", action="store_true", help="list: every fact a rule may name")


def execute(args: argparse.Namespace) -> int:
    if args.action == "list" and args.facts:
        for name, fact in FACTS.items():
            print(f"{name:<32} {KIND_NAMES[fact.kind]:<32} {fact.help}")
        return 0
    try:
        if args.action == "check" and args.paths:
            paths = playbook_paths(args.paths, local_dir=None)
            paths = [
                p
                for p in paths
                if any(p.resolve() == a.resolve() or a.resolve() in p.resolve().parents for a in args.paths)
            ]
        else:
            paths = playbook_paths(args.paths)
        rules = load_playbooks(paths)
    except RuleFileError as e:
        raise UsageError("\n".join(e.errors)) from None
    if args.action == "check":
        print(f"ok: {len(rules)} rules in {len(paths)} file(s)")
        return 0
    for rule in rules:
        then = []
        if rule.then.verdict:
            then.append(f"verdict {rule.then.verdict.kind} (priority {rule.then.verdict.priority})")
        if rule.then.probes:
            then.append("probes " + ", ".join(p.name for p in rule.then.probes))
        if rule.then.finding:
            then.append("finding")
        print(f"{rule.id:<34} {rule.source}\n    {rule.description}\n    -> {'; '.join(then)}")
    return 0
