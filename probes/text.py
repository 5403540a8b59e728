"""Lines of text the loaders' describe() functions share: a stack's frames, and the stacks of a
probe that counts events (page faults, brk, mmap). Pure: a result in, lines out; escaping the
target's strings is the caller's (diagnose/render/probe_text.py)."""

from __future__ import annotations

from memdiag.system.units import fmt_bytes


def stack_lines(frames: list[str], indent: str = "      ", depth: int = 8) -> list[str]:
    """The first frames of a stack, one a line, and how many more there are."""
    out = [indent + f for f in frames[:depth]]
    if len(frames) > depth:
        out.append(indent + f"... {len(frames) - depth} more frames")
    return out


def event_stack_lines(r, top: int, counted: str) -> list[str]:
    """Per-process counts (system-wide), then the heaviest stacks; counted: 'faults' or 'calls'."""
    lines = []
    for p in getattr(r, "per_process", [])[:top]:
        lines.append(f"  PID {p.pid:>7} {p.comm:<16} {p.faults:>9,} faults  {fmt_bytes(p.bytes)}")
    for s in r.stacks[:top]:
        kind = f" {s.kind}" if hasattr(s, "kind") else ""
        lines.append(f"  {fmt_bytes(s.bytes)}{kind} ({s.count:,} {counted}) PID {s.pid} via {s.method}:")
        lines += stack_lines(s.frames)
    return lines
