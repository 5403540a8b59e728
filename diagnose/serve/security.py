"""Every request is hostile until shown otherwise: bearer token (constant-time), Grafana's HMAC
signature, header values checked before use, and a limit on failed authentications per client.
The files that hold serve's secrets (tokens, the HMAC secret, the --notify URLs) are read here too,
under one set of rules."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import threading
import time
from pathlib import Path

from ..errors import UsageError


def read_owner_only(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a file that holds a secret, checked on the descriptor it is read from: a regular
    file owned by root or this user, which neither its group nor others may read or write, at most
    `limit` bytes. UsageError (one line naming the option, the path and the fix) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO must not block the start
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{what} {path}: not a regular file")
        if st.st_uid not in (0, os.geteuid()):
            raise UsageError(f"{what} {path}: owned by uid {st.st_uid}, not root or you: run chown root {path}")
        if st.st_mode & 0o077:
            mode = stat.S_IMODE(st.st_mode)
            raise UsageError(f"{what} {path}: readable or writable by others (mode {mode:o}): run chmod 600 {path}")
        raw = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(raw) > limit:
        raise UsageError(f"{what} {path}: longer than {limit} bytes")
    return raw


# What a bearer token, a hex signature or a timestamp can be: printable ASCII, bounded. A header
# outside this (non-ASCII, control bytes, 10 kB) is a failed authentication, never an exception.
_PRINTABLE = re.compile(r"^[\x21-\x7e]{1,1024}$")
_HEX_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")


def header_ok(value: str | None) -> bool:
    """Whether a credential header's value is one that can be compared at all."""
    return value is not None and _PRINTABLE.match(value.strip()) is not None


def token_ok(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    if not header or not header.startswith("Bearer ") or not header_ok(header[len("Bearer ") :]):
        return False
    return hmac.compare_digest(header[len("Bearer ") :].strip().encode("ascii"), token.encode())


def grafana_signature_ok(body: bytes, signature: str | None, secret: str, timestamp: str | None) -> bool:
    """X-Grafana-Alerting-Signature: hex HMAC-SHA256 of the body, or of '<timestamp>:<body>' when
    Grafana is configured with a timestamp header."""
    if signature is None or not _HEX_SHA256.match(signature.strip()):
        return False
    if timestamp is not None and not header_ok(timestamp):
        return False
    message = f"{timestamp.strip()}:".encode("ascii") + body if timestamp is not None else body
    expected = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode("ascii"), signature.strip().lower().encode("ascii"))


PRUNE_ABOVE = 10_000
MAX_CLIENTS = 100_000


class FailureLimiter:
    """A token bucket per client address that only failures spend: a sender with the right token
    is never refused for sharing an address with a guesser (authenticated work is bounded by the
    diagnosis queue instead)."""

    def __init__(self, rate_per_s: float = 1.0, burst: int = 20):
        self.rate, self.burst = rate_per_s, burst
        self._buckets: dict[str, tuple[float, float]] = {}
        self._pruned = 0.0
        self._lock = threading.Lock()

    def _tokens(self, client: str, now: float) -> float:
        tokens, last = self._buckets.get(client, (float(self.burst), now))
        return min(self.burst, tokens + (now - last) * self.rate)

    def blocked(self, client: str) -> bool:
        """Whether this client has spent its failures: its next failure is answered 429, not 401."""
        with self._lock:
            return self._tokens(client, time.monotonic()) < 1

    def failed(self, client: str) -> None:
        now = time.monotonic()
        with self._lock:
            self._buckets[client] = (max(0.0, self._tokens(client, now) - 1), now)
            # Pruning walks every bucket: at most once a second, or failures from many addresses
            # (IPv6 makes them cheap) would each pay for all the others (measured: 0.33 -> 1.5 ms).
            if len(self._buckets) > PRUNE_ABOVE and now - self._pruned >= 1.0:
                self._pruned = now
                full = self.burst / self.rate  # a bucket untouched this long has refilled: forget it
                kept = {k: v for k, v in self._buckets.items() if now - v[1] < full}
                if len(kept) > MAX_CLIENTS:  # memory bounded whatever the address count: newest kept
                    kept = dict(sorted(kept.items(), key=lambda kv: kv[1][1])[-MAX_CLIENTS // 2 :])
                self._buckets = kept
