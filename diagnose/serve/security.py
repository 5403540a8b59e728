"""Every request is hostile until shown otherwise: bearer token (constant-time), body cap, rate
limit per client, Grafana's HMAC signature."""

from __future__ import annotations

import hashlib
import hmac
import threading
import time


def token_ok(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode(), token.encode())


def grafana_signature_ok(body: bytes, signature: str | None, secret: str, timestamp: str | None) -> bool:
    """X-Grafana-Alerting-Signature: hex HMAC-SHA256 of the body, or of '<timestamp>:<body>' when
    Grafana is configured with a timestamp header."""
    if not signature:
        return False
    message = f"{timestamp}:".encode() + body if timestamp is not None else body
    expected = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature.strip().lower())


class RateLimiter:
    """A token bucket per client address."""

    def __init__(self, rate_per_s: float = 10.0, burst: int = 30):
        self.rate, self.burst = rate_per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._lock = threading.Lock()

    def allow(self, client: str) -> bool:
        now = time.monotonic()
        with self._lock:
            tokens, last = self._buckets.get(client, (float(self.burst), now))
            tokens = min(self.burst, tokens + (now - last) * self.rate)
            if tokens < 1:
                self._buckets[client] = (tokens, now)
                return False
            self._buckets[client] = (tokens - 1, now)
            if len(self._buckets) > 10000:  # forget idle clients
                self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < 60}
            return True
