"""Each backend's live state (from its ``/health`` and ``/metrics`` and the gateway's own counts) and
the read-only views the routers read (``forge.routers.base.ReplicaView``)."""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from forge.core.request import Request
from forge.gateway.load import LoadBook, Polled
from forge.gateway.prefixes import PrefixRecord

log = logging.getLogger("forge.gateway")
_GAUGES = {
    "running": "forge:num_requests_running",
    "waiting": "forge:num_requests_waiting",
    "kv_usage": "forge:kv_cache_usage_perc",
}


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ValueError for anything but http(s)://host[:port][/path]."""
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query or parts.fragment:
        raise ValueError(f"--backend {url!r}: not a URL like http://127.0.0.1:8000")
    return url.rstrip("/")


@dataclass
class Backend:
    url: str
    up: bool = True
    book: LoadBook = field(default_factory=LoadBook)  # its polled figures and the gateway's requests there
    prefixes: PrefixRecord = field(default_factory=PrefixRecord)
    checked_at: float = 0.0

    def row(self) -> dict[str, Any]:
        """Its state for ``GET /gateway/backends``: the polled figures and the estimate now."""
        book, load = self.book, self.book.load()
        return {
            "url": self.url,
            "up": self.up,
            "outstanding": book.outstanding,
            "running": book.polled.running,
            "waiting": book.polled.waiting,
            "kv_usage": book.polled.kv_usage,
            "kv_capacity_tokens": book.polled.kv_capacity_tokens,
            "polls": book.polls_answered,
            "estimated": {"running": load.running, "waiting": load.waiting, "kv_usage": load.kv_usage},
        }


class BackendView:
    """A backend as a router's ``ReplicaView``; ``index`` is its position among the backends offered.
    ``num_running``, ``num_waiting`` and ``kv_usage`` are ``LoadBook.load()``'s estimate (the last
    poll's figures and the gateway's requests since); ``num_outstanding`` and ``outstanding_tokens``
    count the gateway's own requests in flight there."""

    def __init__(self, backend: Backend, index: int) -> None:
        self._b = backend
        self._index = index
        self._load = backend.book.load()

    @property
    def index(self) -> int:
        return self._index

    @property
    def num_waiting(self) -> int:
        return self._load.waiting

    @property
    def num_running(self) -> int:
        return self._load.running

    @property
    def num_outstanding(self) -> int:
        return self._b.book.outstanding

    @property
    def outstanding_tokens(self) -> int:
        return self._b.book.outstanding_tokens

    @property
    def kv_usage(self) -> float:
        return self._load.kv_usage

    def prefix_match(self, request: Request) -> int:
        return self._b.prefixes.match(request.prompt_token_ids)


def parse_metrics(text: str) -> Polled | None:
    """The figures routers read, from a forge server's Prometheus text; None without the load gauges (a
    gauge that is not a finite number counts as missing: it must not stop the health loop)."""
    found: dict[str, float] = {}
    for key, name in _GAUGES.items():
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([-+0-9.eEinfa]+)$", text, re.MULTILINE)
        value = _finite(m.group(1)) if m else None
        if value is not None:
            found[key] = value
    if len(found) < len(_GAUGES):
        return None
    info = re.search(r"^forge:cache_config_info\{([^}]*)\} ", text, re.MULTILINE)
    labels = dict(re.findall(r'(\w+)="(\d+)"', info.group(1))) if info else {}
    capacity = int(labels.get("block_size", 0)) * int(labels.get("num_gpu_blocks", 0))
    return Polled(int(found["running"]), int(found["waiting"]), found["kv_usage"], capacity)


def _finite(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


async def check(client: httpx.AsyncClient, backend: Backend, timeout_s: float) -> None:
    """Health and load of one backend: down when /health does not answer 200 in time. The figures are
    taken only from a /metrics that has them all; else the estimate goes on from the last ones. The poll
    begins as /metrics is asked: a request sent while /health answers is in the figures it reads."""
    polled = None
    try:
        health = await client.get(f"{backend.url}/health", timeout=timeout_s)
        up = health.status_code == 200
        if up:
            number = backend.book.poll_begun()
            polled = parse_metrics((await client.get(f"{backend.url}/metrics", timeout=timeout_s)).text)
    except httpx.HTTPError:
        up = False
    if up != backend.up:
        log.warning("backend %s is %s", backend.url, "up again" if up else "down")
    backend.up = up
    if polled is not None:
        backend.book.poll_answered(number, polled)
    backend.checked_at = time.monotonic()


async def health_loop(client: httpx.AsyncClient, backends: list[Backend], interval_s: float) -> None:
    """Checks every backend every ``interval_s`` seconds, until cancelled."""
    while True:
        await asyncio.gather(*(check(client, b, min(interval_s, 5.0)) for b in backends))
        await asyncio.sleep(interval_s)
