"""Pressure stall information (PSI, Linux 4.20+): /proc/pressure/memory or a cgroup's memory.pressure."""

from __future__ import annotations

from pathlib import Path

from ._parse import Fact, read_text


class PsiLine(Fact):
    """Share of wall time (percent) some/all tasks stalled on memory, and the total in microseconds."""

    avg10: float
    avg60: float
    avg300: float
    total_us: int


class Psi(Fact):
    some: PsiLine | None = None
    full: PsiLine | None = None


def parse_psi(text: str) -> Psi:
    lines: dict[str, PsiLine] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        fields = dict(item.split("=", 1) for item in rest.split() if "=" in item)
        try:
            lines[kind] = PsiLine(
                avg10=float(fields["avg10"]),
                avg60=float(fields["avg60"]),
                avg300=float(fields["avg300"]),
                total_us=int(fields["total"]),
            )
        except (KeyError, ValueError):
            continue
    return Psi(some=lines.get("some"), full=lines.get("full"))


def read_psi_file(path: Path) -> Psi | None:
    """None when the kernel has no PSI (CONFIG_PSI off, or psi=0 on the command line)."""
    text = read_text(path)
    if text is None:
        return None
    return parse_psi(text)


def read_memory_pressure(root: Path = Path("/proc")) -> Psi | None:
    return read_psi_file(root / "pressure" / "memory")
