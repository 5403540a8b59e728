"""One diagnosis at a time (the overhead budget is per host), from a bounded queue."""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable

from ..render import render_all
from ..target import Target
from ..workflow import diagnose
from .store import Store


class QueueFull(Exception):
    pass


class Worker:
    def __init__(
        self,
        store: Store,
        duration: float,
        budget: float,
        rules,
        maxsize: int = 16,
        on_done: Callable[[float, object], None] | None = None,
    ):
        self.store, self.duration, self.budget, self.rules = store, duration, budget, rules
        self.queue: queue.Queue[tuple[str, Target, float | None]] = queue.Queue(maxsize=maxsize)
        self.on_done = on_done
        self.thread = threading.Thread(target=self._loop, name="memdiag-worker", daemon=True)
        self.thread.start()

    def submit(self, iid: str, target: Target, duration: float | None = None) -> None:
        try:
            self.queue.put_nowait((iid, target, duration))
        except queue.Full:
            raise QueueFull from None

    def _loop(self) -> None:
        os.nice(10)  # per thread on Linux: the diagnoses yield the CPU to the services they watch
        while True:
            iid, target, duration = self.queue.get()
            self.store.update(iid, state="running")
            started = time.monotonic()
            try:
                report = diagnose(target, duration or self.duration, budget_percent=self.budget, rules=self.rules)
                out = self.store.report_dir(iid)
                for name, text in render_all(report).items():
                    (out / name).write_text(text)
                    (out / name).chmod(0o600)
                elapsed = time.monotonic() - started
                self.store.update(
                    iid,
                    state="done",
                    verdict_kind=report.verdict.kind,
                    summary=report.verdict.summary,
                    report_dir=str(out),
                    duration_s=elapsed,
                )
                if self.on_done:
                    self.on_done(elapsed, report)
            except Exception as e:  # a failed diagnosis is recorded, the worker goes on
                self.store.update(
                    iid, state="failed", error=f"{type(e).__name__}: {e}", duration_s=time.monotonic() - started
                )
            finally:
                self.queue.task_done()
