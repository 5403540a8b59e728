"""Rule files: ``memdiag rules check [PATH...]`` validates without running; ``memdiag rules list``
shows what is loaded and from where (``--facts``: every fact a rule may name; ``--wrappers``: the
frames passed over when a culprit is named).

``check PATH`` lints any file, trusted or not (read with the same size, alias and regular-file
bounds), and says when a file is not trusted policy; ``check`` alone and ``list`` load policy as a
diagnosis does, refusing what is not trusted."""

from __future__ import annotations

import argparse
from pathlib import Path

from memdiag.rules.catalog import FACTS
from memdiag.rules.loader import RuleFileError, load_playbook, named_paths, playbook_paths
from memdiag.rules.source import untrusted_reason
from memdiag.system.units import KIND_NAMES

from ..errors import UsageError
from ..render.text import plain

SUMMARY = "check rule files, or list the loaded rules, facts or wrappers"
EPILOG = """\
examples:
  memdiag rules check                the policy a diagnosis would load
  memdiag rules check my-rules.yaml  lint one file, trusted or not
  memdiag rules list                 every rule, where it is from, what it does
  memdiag rules list --facts         every fact a rule may name, and its kind
  memdiag rules list --wrappers      frames passed over when naming a culprit

exit status:
  0  the rules are valid (check), or were listed
  2  a rule file is invalid or not trusted"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["check", "list"])
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="rule files or folders (check: only these, trusted or not; list: in addition to the policy)",
    )
    parser.add_argument("--facts", action="store_true", help="list: every fact a rule may name")
    parser.add_argument(
        "--wrappers", action="store_true", help="list: frames passed over when the culprit is named, and from where"
    )


def execute(args: argparse.Namespace) -> int:
    if args.action == "list" and args.facts:
        for name, fact in FACTS.items():
            print(f"{name:<32} {KIND_NAMES[fact.kind]:<32} {fact.help}")
        return 0
    lint = args.action == "check" and bool(args.paths)
    try:
        paths = named_paths(args.paths, trusted=False) if lint else playbook_paths(args.paths)
        book = load_playbook(paths, trusted=not lint)
    except RuleFileError as e:
        raise UsageError(e.usage_text()) from None
    rules = book.rules
    if args.action == "check":
        extra = f" and {len(book.wrappers)} wrappers" if book.wrappers else ""
        print(f"ok: {len(rules)} rules{extra} in {len(paths)} file(s)")
        for p in paths if lint else []:
            if why := untrusted_reason(p):
                print(f"note: {plain(p)} is not trusted policy ({plain(why)}); a diagnosis would refuse it")
        return 0
    if args.wrappers:
        for w in book.wrappers:
            match = " in ".join(f"{k} {v}" for k, v in (("function", w.function), ("module", w.module)) if v)
            print(plain(f"{w.kind:<12} {match:<44} {w.source}" + (f"  ({w.note})" if w.note else "")))
        return 0
    for rule in rules:
        then = []
        if rule.then.verdict:
            then.append(f"verdict {rule.then.verdict.kind} (priority {rule.then.verdict.priority})")
        if rule.then.probes:
            then.append("probes " + ", ".join(p.name for p in rule.then.probes))
        if rule.then.finding:
            then.append("finding")
        shown = [plain(x) for x in (rule.id, rule.source, rule.description, "; ".join(then))]
        print("{:<34} {}\n    {}\n    -> {}".format(*shown))
    return 0
