"""A real headless Chromium (Debian's) driven over the DevTools protocol through --remote-debugging-pipe:
JSON messages on fds 3 and 4, no client library, no port. A page is loaded with what it logs, throws
and requests recorded, so a test asserts on them, evaluates JavaScript in it and takes screenshots."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)
# report.html's flame graph: the names of the frames its search highlights (d3-flame-graph fills them so)
HIGHLIGHTED = """[...document.querySelectorAll('#flame-graph g.frame')]
  .filter(g => g.querySelector('rect').getAttribute('fill') === '#E600E6').map(g => g.getAttribute('name'))"""


class Browser:
    """One Chromium with one page. Events are kept: console messages, exceptions, log entries and
    every request the page sent."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900):
        chromium = shutil.which("chromium")
        if chromium is None:
            pytest.skip("chromium is not installed (scripts/setup.sh --test installs it)")
        to_child, self._to_us = os.pipe(), os.pipe()
        # out of the way of fds 3 and 4 in the child, and closed at its exec
        hi_in = fcntl.fcntl(to_child[0], fcntl.F_DUPFD_CLOEXEC, 10)
        hi_out = fcntl.fcntl(self._to_us[1], fcntl.F_DUPFD_CLOEXEC, 10)

        def fds() -> None:  # the child's fd 3 reads our messages, fd 4 writes its own (dup2: inherited)
            os.dup2(hi_in, 3)
            os.dup2(hi_out, 4)

        self.proc = subprocess.Popen(
            [chromium, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=fds,
            close_fds=False,  # it would close fds 3 and 4 after preexec_fn; Python's own fds are not inherited
        )
        for fd in (to_child[0], self._to_us[1], hi_in, hi_out):
            os.close(fd)
        self._out = to_child[1]
        self._next, self._lock, self._replies = 0, threading.Condition(), {}
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def _read(self) -> None:
        buf = b""
        while chunk := os.read(self._to_us[0], 1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            with self._lock:
                for raw in messages:
                    m = json.loads(raw)
                    if "id" in m:
                        self._replies[m["id"]] = m
                    else:
                        self.events.append(m)
                self._lock.notify_all()

    def call(self, method: str, session: bool = False, timeout: float = 30.0, **params) -> dict:
        with self._lock:
            self._next += 1
            mid = self._next
        msg = {"id": mid, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        with self._lock:
            while mid not in self._replies:
                left = deadline - time.monotonic()
                assert left > 0, f"no reply to {method} in {timeout} s"
                self._lock.wait(left)
            reply = self._replies.pop(mid)
        assert "error" not in reply, f"{method}: {reply['error']}"
        return reply.get("result", {})

    def wait_for(self, method: str, timeout: float = 30.0, after: int = 0) -> dict:
        """The first event of that method from the after-th on."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                found = next((e for e in self.events[after:] if e.get("method") == method), None)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                assert left > 0, f"no {method} in {timeout} s"
                self._lock.wait(left)

    def open(self, url: str, settle_s: float = 1.0) -> None:
        """Load the page, then let its scripts and transitions finish."""
        with self._lock:
            seen = len(self.events)  # about:blank's own load may come after Page.enable: not this page's
        self.call("Page.navigate", session=True, url=url)
        self.wait_for("Page.loadEventFired", after=seen)
        time.sleep(settle_s)

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in r, r["exceptionDetails"]
        return r["result"].get("value")

    def errors(self) -> list[str]:
        """What the page logged as an error or threw."""
        out = []
        with self._lock:
            for e in self.events:
                p = e.get("params", {})
                if e.get("method") == "Runtime.exceptionThrown":
                    out.append(json.dumps(p["exceptionDetails"])[:500])
                elif e.get("method") == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                    out.append(json.dumps(p.get("args"))[:500])
                elif e.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                    out.append(p["entry"].get("text", "")[:500])
        return out

    def requests(self) -> list[str]:
        with self._lock:
            sent = [e for e in self.events if e.get("method") == "Network.requestWillBeSent"]
        return [e["params"]["request"]["url"] for e in sent]

    def screenshot(self, path: Path, height: int | None = None) -> None:
        """A PNG of the page from its top, height pixels tall (the whole page if None)."""
        full = self.eval("document.documentElement.scrollHeight")
        clip = {"x": 0, "y": 0, "width": 1280, "height": min(height or full, full), "scale": 1}
        r = self.call("Page.captureScreenshot", session=True, format="png", clip=clip, captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(r["data"]))

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):  # it may be gone before it replies
            self.call("Browser.close", timeout=10)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._out)
        os.close(self._to_us[0])

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
