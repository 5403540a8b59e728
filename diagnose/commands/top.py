"""Live per-process memory view (vmtop): RSS split, VSZ, swap, fault rates, sorted by RSS growth."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from memdiag.system.meminfo import read_meminfo
from memdiag.system.process import ProcessMemory
from memdiag.system.processes import read_all_processes
from memdiag.system.psi import read_memory_pressure
from memdiag.system.signals import INTERRUPTION
from memdiag.system.trends import counter_rate
from memdiag.system.units import fmt_bytes
from memdiag.system.vmstat import read_vmstat

from ..errors import SignalInterrupted
from ..options import INTERVAL, ROWS
from ..render.text import plain

SUMMARY = "live per-process memory view (RSS split, swap, fault rates), sorted by RSS growth"
EPILOG = """\
examples:
  memdiag top                    refresh every second until Ctrl-C
  memdiag top --once -n 10       one table of the ten fastest-growing processes
  memdiag top --interval 5s

exit status:
  0  --once printed its table      2  bad usage
  130, 143  ended by SIGINT, SIGTERM (the usual end of the live view)"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--once", action="store_true", help="print one table (after one interval) and exit")
    parser.add_argument(
        "--interval", type=INTERVAL, default=1.0, metavar="DURATION", help="refresh every 2s, 500ms ... (default 1s)"
    )
    parser.add_argument(
        "-n",
        "--lines",
        type=ROWS,
        default=None,
        metavar="N",
        help="show N processes (default: fit the terminal, 20 with --once)",
    )


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f}"


def render_table(
    before: dict[int, ProcessMemory],
    after: dict[int, ProcessMemory],
    seconds: float,
    lines: int,
    proc_root: Path = Path("/proc"),
    vm_before=None,
    vm_after=None,
) -> str:
    meminfo = read_meminfo(proc_root)
    psi = read_memory_pressure(proc_root)
    swapin = swapout = None
    if vm_before is not None and vm_after is not None:
        swapin = counter_rate(vm_before.get("pswpin"), vm_after.get("pswpin"), seconds)
        swapout = counter_rate(vm_before.get("pswpout"), vm_after.get("pswpout"), seconds)
    psi_text = f"{psi.some.avg10:.2f}/{psi.full.avg10:.2f}" if psi and psi.some and psi.full else "n/a"
    out = [
        f"MemAvailable {fmt_bytes(meminfo.mem_available)} of {fmt_bytes(meminfo.mem_total)}"
        f"  swap used {fmt_bytes(meminfo.swap_used)}"
        f"  swap in/out {swapin or 0:.0f}/{swapout or 0:.0f} pages/s"
        f"  PSI some/full avg10 {psi_text}%",
        f"{'PID':>7} {'COMM':<16} {'RSS MiB':>9} {'ANON':>9} {'FILE':>8} {'SHMEM':>7} {'VSZ MiB':>10} "
        f"{'SWAP':>7} {'GROW KiB/s':>10} {'MINFLT/s':>9} {'MAJFLT/s':>8}",
    ]
    rows = []
    for pid, p in after.items():
        b = before.get(pid)
        if b is not None and b.start_ticks != p.start_ticks:
            b = None
        growth = ((p.rss or 0) - (b.rss or 0)) / seconds if b and seconds > 0 else 0.0
        minflt = counter_rate(b.minflt, p.minflt, seconds) if b else None
        majflt = counter_rate(b.majflt, p.majflt, seconds) if b else None
        rows.append((growth, p.rss or 0, p, minflt, majflt))
    rows.sort(key=lambda r: (r[0], r[1]), reverse=True)
    for growth, _, p, minflt, majflt in rows[:lines]:
        out.append(
            f"{p.pid:>7} {plain(p.comm[:16]):<16} {_mib(p.rss):>9} {_mib(p.rss_anon):>9} {_mib(p.rss_file):>8} "
            f"{_mib(p.rss_shmem):>7} {_mib(p.vm_size):>10} {_mib(p.vm_swap):>7} {growth / 1024:>10.1f} "
            f"{minflt or 0:>9.0f} {majflt or 0:>8.0f}"
        )
    return "\n".join(out)


def execute(args: argparse.Namespace) -> int:
    before, vm_before, t0 = read_all_processes(), read_vmstat(), time.monotonic()
    while True:
        if INTERRUPTION.wait(args.interval):  # nothing to clean up: say which signal ended it
            raise SignalInterrupted(INTERRUPTION.signum or 0, f"interrupted by {INTERRUPTION.signal_name}")
        after, vm_after, t1 = read_all_processes(), read_vmstat(), time.monotonic()
        if args.once:
            print(render_table(before, after, t1 - t0, args.lines or 20, vm_before=vm_before, vm_after=vm_after))
            return 0
        height = args.lines or max(5, shutil.get_terminal_size().lines - 3)
        sys.stdout.write(
            "\x1b[H\x1b[2J"
            + render_table(before, after, t1 - t0, height, vm_before=vm_before, vm_after=vm_after)
            + "\n"
        )
        sys.stdout.flush()
        before, vm_before, t0 = after, vm_after, t1
