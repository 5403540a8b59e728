"""The always-on OOM watch: the oomkill probe polled for as long as the server runs; each kill
becomes an incident with victim, trigger, cgroup, limit and host memory at that moment, and the
cgroup is diagnosed if anything in it still runs."""

from __future__ import annotations

import collections
import sys
import threading
from collections.abc import Callable

from memdiag.probes.oomkill import OomEvent, OomWatch

from ..units import fmt_bytes


def describe(e: OomEvent) -> str:
    scope = "cgroup limit" if e.cgroup_oom else "system out of memory"
    limit = f" (limit {fmt_bytes(e.limit)})" if e.limit else ""
    outside = f" ({e.outside_namespace})" if e.outside_namespace else ""
    return (
        f"OOM killer killed {e.victim()}, anon RSS {fmt_bytes(e.anon_rss)}: {scope}"
        f" in {e.memcg or e.victim_cgroup or 'unknown cgroup'}{limit}; triggered by {e.trigger()}"
        f"; host MemAvailable {fmt_bytes(e.mem_available)}{outside}"
    )


class OomWatcher:
    def __init__(self, on_kill: Callable[[OomEvent], None]):
        self.on_kill = on_kill
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: str | None = None
        # kills whose record failed (storage refusing): retried each poll; bounded, oldest dropped
        self.backlog: collections.deque[OomEvent] = collections.deque(maxlen=1000)
        self.thread = threading.Thread(target=self._loop, name="memdiag-oomwatch", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        try:
            watch = OomWatch()
        except Exception as e:  # unavailable kernel features: the server runs on without the watch
            self.error = str(e)
            self.ready.set()
            return
        self.ready.set()
        try:
            while not self.stop.is_set():
                self.backlog.extend(watch.poll(250))
                for _ in range(len(self.backlog)):
                    event = self.backlog.popleft()
                    try:
                        self.on_kill(event)
                    except Exception as e:  # noqa: BLE001 (kept and retried: the watch never ends)
                        self.backlog.append(event)
                        pid = event.victim_pid or event.victim_host_pid
                        print(
                            f"memdiag serve: OOM kill of PID {pid} not recorded yet: {e}",
                            file=sys.stderr,
                            flush=True,
                        )
                        break
        finally:
            watch.close()
