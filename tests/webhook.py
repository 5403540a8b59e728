"""A real HTTP webhook receiver on a loopback port, for the notifier's tests: it answers each POST
with the next status of a script (then the last one for ever), after a delay if asked, and keeps
what it was sent."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses: list[int] | None = None, delay_s: float = 0.0):
        self.statuses = list(statuses or [200])
        self.delay_s = delay_s  # before each answer: a slow service (apprise reads for at most 4 s)
        self.received: list[dict] = []  # {"path", "status", "body" (parsed JSON), "headers"}
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                raw = self.rfile.read(min(int(self.headers.get("content-length") or 0), 1 << 20))
                with owner._lock:
                    status = owner.statuses[min(len(owner.received), len(owner.statuses) - 1)]
                    owner.received.append(
                        {"path": self.path, "status": status, "body": json.loads(raw), "headers": dict(self.headers)}
                    )
                time.sleep(owner.delay_s)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def url(self, path: str = "/hook") -> str:
        """apprise's generic JSON webhook form for this receiver."""
        return f"json://127.0.0.1:{self.port}{path}"

    def wait(self, count: int, timeout: float = 60) -> list[dict]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if len(self.received) >= count:
                    return list(self.received)
            time.sleep(0.1)
        raise AssertionError(f"the receiver got {len(self.received)} posts, not {count}, in {timeout:g} s")
