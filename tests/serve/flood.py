"""Slow clients against a real server: sockets that connect and say nothing, or send their headers
and then trickle the body a byte at a time. What the server answered each is kept (Flood.answers).
Closed by the caller (Flood.close) in a finally."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class Flood:
    """n sockets: half idle and half trickling a body, or (every_one_asks) all trickling one."""

    def __init__(self, port: int, n: int, token: str, every_one_asks: bool = False):
        self.port, self.token, self.every_one_asks = port, token, every_one_asks
        self.socks: list[socket.socket] = []
        self.answers: dict[int, bytes] = {}  # socket index -> the bytes the server sent it
        self.refused = 0
        self._stop = threading.Event()
        for i in range(n):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect_ex(("127.0.0.1", port))
            except OSError:
                self.refused += 1
                s.close()
                continue
            self.socks.append(s)
            if every_one_asks or i % 2:  # these send headers and promise a body they trickle
                self._send(
                    s,
                    f"POST /alerts/alertmanager HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                    "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{".encode(),
                )
        self._thread = threading.Thread(target=self._trickle, daemon=True)
        self._thread.start()

    def _send(self, s: socket.socket, data: bytes) -> None:
        deadline = time.monotonic() + 1
        while time.monotonic() < deadline:
            try:
                s.send(data)
                return
            except BlockingIOError:
                time.sleep(0.001)  # not connected yet
            except OSError:
                return  # closed by the server: what the server is meant to do

    def _trickle(self) -> None:
        asking = self.socks if self.every_one_asks else self.socks[1::2]
        while not self._stop.wait(0.5):
            for s in asking:
                with contextlib.suppress(OSError):  # closed by the server: what it is meant to do
                    s.send(b" ")

    def open_count(self) -> int:
        """How many of the flood's sockets the server still holds open (reading to EOF or reset); what
        was read is kept in `answers`."""
        return sum(self._open(i, s) for i, s in enumerate(self.socks))

    def _open(self, i: int, s: socket.socket) -> bool:
        try:
            while chunk := s.recv(65536):
                self.answers[i] = self.answers.get(i, b"") + chunk  # an answer (408, 503) before the close
            return False
        except BlockingIOError:
            return True
        except OSError:
            return False

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()


def healthz_seconds(port: int, timeout: float = 30) -> float:
    """Wall time of one GET /healthz on a fresh connection, up to the full answer."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    if not answer.startswith(b"HTTP/1.1 200"):
        raise AssertionError(f"/healthz answered {answer[:80]!r}")
    return time.monotonic() - started
