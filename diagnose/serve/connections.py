"""Connections to `memdiag serve` are bounded in number and in time, below the application: a
client that opens a socket and sends nothing, or sends its headers a byte at a time, holds a file
descriptor for seconds, not forever, and a flood of them evicts its own oldest members instead of
locking out /healthz or running the process out of descriptors.

uvicorn 0.35 has no header-read timeout (timeout_keep_alive starts only after a response) and its
limit_concurrency answers 503 to new requests while keeping every socket open, so the rules live
in a subclass of its h11 protocol."""

from __future__ import annotations

import asyncio
import resource

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 512
IDLE_SECONDS = 10.0  # a connection with no request in flight is closed this long after it opened or last answered


def connection_limit() -> int:
    """MAX_CONNECTIONS, or fewer when the descriptor limit would not leave room for the rest."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, min(MAX_CONNECTIONS, soft - 128)) if soft != resource.RLIM_INFINITY else MAX_CONNECTIONS


class BoundedH11(H11Protocol):
    """H11Protocol with an idle deadline per connection and a cap on how many are open."""

    max_connections = MAX_CONNECTIONS
    idle_seconds = IDLE_SECONDS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = self.loop.time()
        self._deadline: asyncio.TimerHandle | None = None
        self._arm()
        self._evict()

    def connection_lost(self, exc: Exception | None) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
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
        for victim in waiting[:excess]:
            victim.transport.close()
        if len(waiting) < excess:
            self.transport.close()


def bounded_protocol(max_connections: int, idle_seconds: float = IDLE_SECONDS) -> type[BoundedH11]:
    """The protocol class to give uvicorn.Config(http=...)."""
    return type("BoundedH11", (BoundedH11,), {"max_connections": max_connections, "idle_seconds": idle_seconds})
