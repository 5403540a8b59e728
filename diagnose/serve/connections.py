"""Connections to `memdiag serve` are bounded in number and in time, below the application: a
client that opens a socket and sends nothing, or sends its headers a byte at a time, holds a file
descriptor for seconds, not forever, and a flood of them evicts its own oldest members instead of
locking out /healthz or running the process out of descriptors.

uvicorn 0.35 has no header-read timeout (timeout_keep_alive starts only after a response), and its
limit_concurrency answers requests over the cap with a plain-text 503 while keeping every socket
open, so the rules live in a subclass of its h11 protocol (and limit_concurrency is not used).
What the cap refuses is answered as the application answers every refusal: a JSON reason (503,
deliver again later), as is a request h11 cannot parse (400)."""

from __future__ import annotations

import asyncio
import json
import resource

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 512
IDLE_SECONDS = 10.0  # a connection with no request in flight is closed this long after it opened or last answered
RESERVED_FDS = 128  # descriptors kept for the rest of the process (database, BPF maps, runtime CLIs)


def connection_limit(backlog: int) -> int:
    """MAX_CONNECTIONS, or fewer when the descriptor limit would not leave room for the rest. asyncio
    accepts up to `backlog` sockets in one go before their connection_made (where the cap acts) runs,
    and a socket closed there keeps its descriptor until the next tick: two bursts are in flight at
    once (with 1,024 descriptors and 1,100 clients a cap of soft - 128 ran out of them: EMFILE)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(16, min(MAX_CONNECTIONS, soft - 2 * backlog - RESERVED_FDS))


def refusal(status: int, reason: str) -> bytes:
    """A whole HTTP/1.1 answer with a JSON reason, as the application words its refusals (app._error),
    for a connection closed right after it (the protocol layer's own refusals)."""
    body = json.dumps({"error": reason}).encode()
    phrase = {400: "Bad Request", 503: "Service Unavailable"}[status]
    head = (
        f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n"
    )
    retry = "retry-after: 1\r\n" if status == 503 else ""
    return (head + retry + "\r\n").encode() + body


class BoundedH11(H11Protocol):
    """H11Protocol with an idle deadline per connection and a cap on how many are open."""

    max_connections = MAX_CONNECTIONS
    idle_seconds = IDLE_SECONDS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        self._deadline: asyncio.TimerHandle | None = None
        self._heard = False  # whether the client has sent anything since its last answer
        self._arm()
        self._evict()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._heard = True
        super().data_received(data)

    def send_400_response(self, msg: str) -> None:
        """A request h11 cannot parse: 400 with a JSON reason (uvicorn's own is plain text)."""
        self.logger.debug(msg)  # uvicorn warned already
        self.transport.write(refusal(400, "malformed HTTP request"))
        self.transport.close()

    def refuse(self, reason: str) -> None:
        """Close this connection for the cap, telling the client why (503: deliver again later) unless it
        is idle after an answer, with nothing asked since (a keep-alive client would take an answer
        then for the one to its next request). A new connection is told too: its request may be in
        the socket unread. The answer bypasses h11: the connection closes right after it, and the
        application's own answer, if it comes, finds the cycle disconnected and is dropped."""
        cycle = self.cycle
        if not (cycle is not None and cycle.response_complete and not self._heard):
            self.transport.write(refusal(503, reason))
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._heard = False  # answered: idle again until the next request begins
        self._arm()

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(self.idle_seconds, self._idle_deadline)

    def _waiting(self) -> bool:
        """No request being handled: still reading headers, idle, or still receiving a body (the
        application reads bodies under its own deadline, but an evicted body is no loss)."""
        cycle = self.cycle
        return cycle is None or cycle.response_complete or (cycle.more_body and not cycle.response_started)

    def _idle_deadline(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()

    def _evict(self) -> None:
        """While over the cap, close the oldest connection that is waiting, or this new one if every
        other is busy. Closed transports stay in the set until asyncio calls connection_lost, a tick
        later, so they are not counted: a burst of accepts must not all pick the same victim."""
        live = [c for c in self.connections if isinstance(c, BoundedH11) and not c.transport.is_closing()]
        excess = len(live) - self.max_connections
        if excess <= 0:
            return
        waiting = sorted((c for c in live if c is not self and c._waiting()), key=lambda c: c._opened)
        over = f"too many open connections (at most {self.max_connections})"
        for victim in waiting[:excess]:
            victim.refuse(f"{over}: closed for a newer one as the one waiting longest; deliver again later")
        if len(waiting) < excess:
            self.refuse(f"{over}, every one busy: deliver again later")


def bounded_protocol(max_connections: int, idle_seconds: float = IDLE_SECONDS) -> type[BoundedH11]:
    """The protocol class to give uvicorn.Config(http=...)."""
    return type("BoundedH11", (BoundedH11,), {"max_connections": max_connections, "idle_seconds": idle_seconds})
