"""Each backend's live state (from its ``/health`` and ``/metrics`` and the gateway's own counts) and
the read-only views the routers read (``forge.routers.base.ReplicaView``)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from forge.core.request import Request
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
    running: int = 0  # from its /metrics, at the last check
    waiting: int = 0
    kv_usage: float = 0.0
    outstanding: int = 0  # the gateway's requests in flight there
    outstanding_tokens: int = 0
    prefixes: PrefixRecord = field(default_factory=PrefixRecord)
    checked_at: float = 0.0


class BackendView:
    """A backend as a router's ``ReplicaView``; ``index`` is its position among the backends offered."""

    def __init__(self, backend: Backend, index: int) -> None:
        self._b = backend
        self._index = index

    @property
    def index(self) -> int:
        return self._index

    @property
    def num_waiting(self) -> int:
        return self._b.waiting

    @property
    def num_running(self) -> int:
        return self._b.running

    @property
    def num_outstanding(self) -> int:
        return self._b.outstanding

    @property
    def outstanding_tokens(self) -> int:
        return self._b.outstanding_tokens

    @property
    def kv_usage(self) -> float:
        return self._b.kv_usage

    def prefix_match(self, request: Request) -> int:
        return self._b.prefixes.match(request.prompt_token_ids)


def parse_metrics(text: str) -> dict[str, float]:
    """The gauges routers read, from a forge server's Prometheus text."""
    out: dict[str, float] = {}
    for key, name in _GAUGES.items():
        m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([-+0-9.eEinfa]+)$", text, re.MULTILINE)
        if m:
            out[key] = float(m.group(1))
    return out


async def check(client: httpx.AsyncClient, backend: Backend, timeout_s: float) -> None:
    """Health and load of one backend: down when /health does not answer 200 in time."""
    try:
        health = await client.get(f"{backend.url}/health", timeout=timeout_s)
        up = health.status_code == 200
        gauges = parse_metrics((await client.get(f"{backend.url}/metrics", timeout=timeout_s)).text) if up else {}
    except httpx.HTTPError:
        up, gauges = False, {}
    if up != backend.up:
        log.warning("backend %s is %s", backend.url, "up again" if up else "down")
    backend.up = up
    backend.running = int(gauges.get("running", backend.running))
    backend.waiting = int(gauges.get("waiting", backend.waiting))
    backend.kv_usage = float(gauges.get("kv_usage", backend.kv_usage))
    backend.checked_at = time.monotonic()


async def health_loop(client: httpx.AsyncClient, backends: list[Backend], interval_s: float) -> None:
    """Checks every backend every ``interval_s`` seconds, until cancelled."""
    while True:
        await asyncio.gather(*(check(client, b, min(interval_s, 5.0)) for b in backends))
        await asyncio.sleep(interval_s)
