"""API-key check and a per-key token-bucket rate limit."""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class TokenBucket:
    """``rate`` tokens per second up to ``capacity``; each request takes one."""

    rate: float
    capacity: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """0.0 if a token was taken, else the seconds until one is available."""
        self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class RateLimiter:
    """One bucket per key (the API key, or the client address when auth is off)."""

    def __init__(
        self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000
    ) -> None:
        self.rate = rate
        self.capacity = float(burst) if burst > 0 else max(1.0, rate)
        self.clock = clock
        self.max_keys = max_keys
        self._buckets: dict[str, TokenBucket] = {}

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def check(self, key: str) -> int:
        """0 if allowed, else the whole seconds to send in ``Retry-After`` (>= 1)."""
        if not self.enabled:
            return 0
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._buckets.clear()
            bucket = self._buckets[key] = TokenBucket(self.rate, self.capacity, self.capacity, now)
        wait = bucket.take(now)
        return 0 if wait == 0.0 else max(1, math.ceil(wait))


def bearer_key(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def key_is_valid(key: str, keys: frozenset[str]) -> bool:
    """Constant-time comparison against every accepted key, on bytes: ``key`` is the header's
    text decoded as latin-1 (one character per raw byte), the accepted keys are UTF-8. Any
    header text, non-ASCII included, is a valid or a wrong key, never an error."""
    given = key.encode("latin-1", "replace")
    return any(hmac.compare_digest(given, k.encode("utf-8", "surrogateescape")) for k in keys)
