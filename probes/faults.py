"""faults: page faults by user stack — where RSS grows, as pages actually touched.

Method: the raw tracepoint exceptions:page_fault_user (its arguments carry the user registers),
counted in the kernel per stack; one copy of the user stack per new stack lets user space unwind
glibc's frameless code with .eh_frame and name the application function that touched the pages.
With no target: faults per process across the system."""

from __future__ import annotations

import os
import time

from pydantic import BaseModel

from . import kernel
from .base import (
    ProbeResult,
    ProbeTarget,
    ProbeUnavailable,
    bpf_stats,
    load,
    measure_cost,
    require,
    run_for,
    set_targets,
    stop_on_signals,
    unavailable,
)
from .growth import RawStack, Spaces, StackGrowth, folded_lines, merge_stacks

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
METHOD = "raw tracepoint exceptions:page_fault_user, kernel stacks + .eh_frame unwinding"


class ProcessFaults(BaseModel):
    pid: int
    comm: str
    faults: int
    bytes: int


class FaultsResult(ProbeResult):
    stacks: list[StackGrowth] = []
    folded: list[str] = []
    per_process: list[ProcessFaults] = []


def requirements() -> list[kernel.Availability]:
    return [kernel.tracepoint("exceptions", "page_fault_user")]


def run(target: ProbeTarget, duration: float, top: int = 50) -> FaultsResult:
    try:
        require(*requirements())
    except ProbeUnavailable as e:
        return FaultsResult(**unavailable("faults", target, str(e)))
    per_process = target.kind == "system"
    started = time.time()
    spaces = Spaces()
    try:
        bpf = load("faults", {"TARGET_MODE": 0 if per_process else 1, "PER_PROCESS": int(per_process)})
    except ProbeUnavailable as e:
        return FaultsResult(**unavailable("faults", target, str(e)))
    except Exception as e:  # bcc raises bare Exception when the kernel refuses a program
        return FaultsResult(name="faults", status="error", reason=f"loading failed: {e}", target=target.description)
    try:
        pids = target.pids()
        set_targets(bpf, pids)
        spaces.refresh(pids)
        with bpf_stats(), stop_on_signals() as stop:

            def tick(_elapsed: float) -> None:
                if target.kind == "cgroup":  # processes come and go in a cgroup
                    now = target.pids()
                    set_targets(bpf, now - pids)
                    pids.update(now)
                spaces.refresh(pids)

            elapsed = run_for(duration, target, stop, on_tick=tick)
            stats = [bpf["stats"][i].value for i in range(4)]
            cost = measure_cost(bpf, events=stats[0])
            raw, procs = _collect(bpf, per_process)
    finally:
        bpf.cleanup()
    stacks, failed = merge_stacks(raw, spaces)
    lost = {
        "stack_errors": stats[1],
        "samples_dropped": stats[2],
        "keys_dropped": stats[3],
        "symbol_lookups_failed": failed,
    }
    status = "partial" if stats[3] else "ok"
    return FaultsResult(
        name="faults",
        status=status,
        reason="count table full: some faults were not counted" if stats[3] else "",
        method="raw tracepoint exceptions:page_fault_user, per process" if per_process else METHOD,
        target=target.description,
        started=started,
        duration_s=elapsed,
        target_exited_at=stop.target_exited_at,
        interrupted=stop.interrupted,
        lost=lost,
        cost=cost,
        stacks=stacks[:top],
        folded=folded_lines(stacks),
        per_process=sorted(procs, key=lambda p: p.faults, reverse=True)[:top],
    )


def _collect(bpf, per_process: bool) -> tuple[list[RawStack], list[ProcessFaults]]:
    if per_process:
        procs = [
            ProcessFaults(pid=k.tgid, comm=k.comm.decode(errors="replace"), faults=v.value, bytes=v.value * PAGE_SIZE)
            for k, v in bpf["per_process"].items()
        ]
        return [], procs
    stack_table, samples = bpf["stacks"], bpf["samples"]
    raw = []
    for key, count in bpf["counts"].items():
        fp = list(stack_table.walk(key.stack_id)) if key.stack_id >= 0 else [key.ip]
        regs = data = None
        try:
            s = samples[key]
            regs = (s.regs.ip, s.regs.sp, s.regs.bp)
            data = bytes(bytearray(s.data)[: s.len])
        except KeyError:
            pass
        raw.append(
            RawStack(pid=key.tgid, fp_stack=fp, regs=regs, stack=data, count=count.value, bytes=count.value * PAGE_SIZE)
        )
    return raw, []
