"""Token bucket that caps the bytes a node sends per second on its data plane,
so a local cluster on loopback can emulate a real network link.

Algorithm: tokens (bytes) refill at `rate` bytes/s up to `burst` bytes.
`take(n)` always admits the n bytes but may leave the bucket in debt; it
returns how long the caller must wait before sending them, (debt) / rate. A
request larger than the burst is therefore admitted too: it just waits longer,
so any chunk size works and the long-run rate never exceeds `rate` (plus one
burst). The caller sleeps; the bucket only does arithmetic on an injectable
clock. Thread-safe: one bucket is shared by every transfer leaving the node.

Thresholds: burst defaults to 10 ms of traffic at the rate (at least 64 KiB),
small enough that a transfer of a few MiB is paced, not bursty.
"""
from __future__ import annotations

import threading

from speckv.services.common.clock import Clock
from speckv.services.common.errors import InvalidArgument

BURST_S = 0.010
MIN_BURST = 64 * 1024


def gbit_to_bytes_per_s(gbps: float) -> float:
    """Link rates are quoted in Gbit/s, as the scheduler's link model does."""
    return gbps * 1e9 / 8.0


class TokenBucket:
    """rate in bytes/s, burst in bytes; starts full."""

    def __init__(self, rate: float, clock: Clock, burst: float | None = None) -> None:
        if not rate > 0:
            raise InvalidArgument(f"rate={rate}: a token bucket needs a positive byte rate")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else max(MIN_BURST, rate * BURST_S))
        if not self.burst > 0:
            raise InvalidArgument(f"burst={burst}: must be > 0")
        self._clock = clock
        self._tokens = self.burst
        self._stamp = clock.now()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> float:
        """Debits nbytes; returns the seconds to wait before sending them."""
        if nbytes < 0:
            raise InvalidArgument(f"nbytes={nbytes}: must be >= 0")
        with self._lock:
            now = self._clock.now()
            self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= nbytes
            return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    @property
    def tokens(self) -> float:
        """Tokens as of the last take (negative: debt)."""
        with self._lock:
            return self._tokens
