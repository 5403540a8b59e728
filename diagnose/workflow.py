"""One diagnosis end to end: the engine (counters, rules, probes), then the Report (assemble.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from memdiag.rules.loader import load_playbook, playbook_paths
from memdiag.rules.model import Playbook, Rule
from memdiag.system import identity

from .assemble import assemble
from .culprit import shipped_wrappers
from .cycles import cycle_length
from .engine import Engine
from .report import Report
from .snapshot import Snapshot
from .target import Target

DEFAULT_BUDGET_PERCENT = 2.0
# The longest one stop of the target for the reachability scan, whatever the budget: a budget is a
# share of time, and a long enough window would otherwise allow a stop-the-world of seconds (a
# 20% budget over 30 s: 6 s), which a service's clients feel as an outage rather than a slowdown.
DEFAULT_MAX_PAUSE_MS = 1000.0


def load_book(extra: list[Path] | None = None) -> Playbook:
    """The rules and wrappers of trusted policy: the shipped playbook, the site folder and the
    --playbook paths (memdiag.rules.source; never the working folder's playbooks/)."""
    return load_playbook(playbook_paths(extra))


def load_rules(extra: list[Path] | None = None) -> list[Rule]:
    return load_book(extra).rules


def _playbook(rules: Playbook | list[Rule] | None) -> Playbook:
    """A bare list of rules (tests, callers of old) gets the shipped wrappers."""
    if rules is None:
        return load_book()
    if isinstance(rules, Playbook):
        return rules
    return Playbook(rules=rules, wrappers=list(shipped_wrappers()))


def diagnose(
    target: Target,
    duration: float,
    interval: float | None = None,
    budget_percent: float = DEFAULT_BUDGET_PERCENT,
    on_sample: Callable[[Snapshot, float], None] | None = None,
    rules: Playbook | list[Rule] | None = None,
    on_step: Callable[[str], None] | None = None,
    proc_root: Path = Path("/proc"),
    max_pause_ms: float = DEFAULT_MAX_PAUSE_MS,
    given: dict | None = None,
    cycle_s: float | None = None,
    on_interim: Callable[[Report], None] | None = None,
) -> Report:
    """Diagnose the target over the window: the engine under the playbook's rules, then the Report.
    given: facts the caller knows beforehand (memdiag verify: what the earlier report named);
    cycle_s: a long window's cycle (diagnose/cycles.py; None: the default for the window's
    length); on_interim receives the report of the window so far after each cycle."""
    book = _playbook(rules)
    engine = Engine(
        book.rules,
        target,
        duration,
        budget_percent,
        interval,
        on_sample=on_sample,
        on_step=on_step,
        max_pause_ms=max_pause_ms,
        wrappers=book.wrappers,
        given=given,
        cycle_s=cycle_length(duration, cycle_s),
        on_cycle=(lambda r: on_interim(assemble(r, budget_percent))) if on_interim is not None else None,
    )
    try:
        return assemble(engine.run(), budget_percent)
    finally:
        identity.release(target)  # the pidfd held since the target was resolved (system/identity.py)
