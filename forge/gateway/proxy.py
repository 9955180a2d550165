"""The gateway's HTTP app: every OpenAI route of ``forge serve`` forwarded to the backend a router picks.

- A request that fails before its first byte (the backend unreachable, or a 5xx answer) is retried
  once on another backend; the backend that did not answer is marked down until a health check
  finds it up.
- A stream is passed through chunk by chunk; one that breaks mid-way ends with an error chunk and
  ``data: [DONE]``. A client that disconnects closes the backend request, which aborts it there.
- No backend up: 503. The gateway's API keys are checked on ``/v1/*``; the backend key, if set,
  replaces the client's ``Authorization`` header (else it is passed on).
- ``/metrics`` is the gateway's own (``forge_router:`` prefix); ``/gateway/backends`` lists the backends."""

from __future__ import annotations

import contextlib
import hmac
import itertools
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from forge.gateway.backends import Backend, BackendView, health_loop
from forge.gateway.load import Cost, LoadBook, Ticket
from forge.gateway.routing import routing_request
from forge.routers.base import Router

FORWARDED = ("/v1/completions", "/v1/chat/completions", "/v1/embeddings")
Handler = Callable[..., Awaitable[Response]]
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "host", "keep-alive"}


@dataclass
class GatewaySettings:
    api_keys: tuple[str, ...] = ()
    backend_api_key: str | None = None
    health_interval_s: float = 2.0
    connect_timeout_s: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("forge_router:requests", "Requests sent to each backend.", ["backend"], registry=r)
        self.retries = Counter("forge_router:retries", "Requests retried on another backend.", registry=r)
        self.failures = Counter("forge_router:backend_failures", "Failed sends by backend.", ["backend"], registry=r)
        self.up = Gauge("forge_router:backends_up", "Backends answering their health check.", registry=r)
        self.decision = Histogram(
            "forge_router:routing_decision_seconds",
            "Time the router took to pick a backend.",
            buckets=(1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2),
            registry=r,
        )


def error(status: int, message: str, kind: str = "server_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}}, status)


class Gateway:
    """The routing state behind the app: the backends, the router and the gateway's metrics."""

    def __init__(self, backends: Sequence[Backend], router: Router, settings: GatewaySettings) -> None:
        self.backends = list(backends)
        self.router = router
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.ids = itertools.count()

    def choose(self, path: str, body: dict[str, Any], exclude: set[int]) -> tuple[int, Cost] | None:
        """(backend position, what the request is counted as there), or None when no backend is up."""
        offered = [i for i, b in enumerate(self.backends) if b.up and i not in exclude]
        if not offered:
            return None
        routed = routing_request(f"gw-{next(self.ids)}", path, body)
        t0 = time.perf_counter()
        pick = self.router.route(routed.request, [BackendView(self.backends[i], k) for k, i in enumerate(offered)])
        self.metrics.decision.observe(time.perf_counter() - t0)
        chosen = self.backends[offered[pick]]
        cost = routed.cost(chosen.prefixes.match(routed.request.prompt_token_ids))
        chosen.prefixes.add(routed.request.prompt_token_ids)
        return offered[pick], cost

    def authorised(self, request: Request) -> bool:
        if not self.settings.api_keys:
            return True
        given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        return any(hmac.compare_digest(given.encode(), k.encode()) for k in self.settings.api_keys)

    def headers(self, request: Request) -> dict[str, str]:
        out = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        if self.settings.backend_api_key is not None:
            out["authorization"] = f"Bearer {self.settings.backend_api_key}"
        return out


def build_gateway_app(gateway: Gateway) -> FastAPI:
    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=gateway.settings.connect_timeout_s))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        import asyncio

        task = asyncio.create_task(health_loop(client, gateway.backends, gateway.settings.health_interval_s))
        yield
        task.cancel()
        await client.aclose()

    app = FastAPI(title="forge route", lifespan=lifespan)
    for path in FORWARDED:
        app.add_api_route(path, _forwarder(gateway, client, path), methods=["POST"])
    app.add_api_route("/v1/models", _models(gateway, client), methods=["GET"])
    app.add_api_route("/health", _health(gateway), methods=["GET"])
    app.add_api_route("/metrics", _metrics(gateway), methods=["GET"])
    app.add_api_route("/gateway/backends", _backends(gateway), methods=["GET"])
    return app


def _forwarder(gateway: Gateway, client: httpx.AsyncClient, path: str) -> Handler:
    async def forward(request: Request) -> Response:
        if not gateway.authorised(request):
            return error(401, "invalid API key", "authentication_error")
        raw = await request.body()
        if len(raw) > gateway.settings.max_body_bytes:
            return error(413, f"request body over {gateway.settings.max_body_bytes} bytes", "invalid_request_error")
        try:
            body = json.loads(raw)
        except ValueError:
            return error(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict):
            return error(400, "the request body must be a JSON object", "invalid_request_error")
        return await send(gateway, client, request, path, raw, body)

    return forward


async def send(
    gateway: Gateway, client: httpx.AsyncClient, request: Request, path: str, raw: bytes, body: dict[str, Any]
) -> Response:
    """Forwards to a routed backend, retrying once elsewhere if it fails before its first byte."""
    tried: set[int] = set()
    for attempt in range(2):
        choice = gateway.choose(path, body, tried)
        if choice is None:
            return error(503, "no backend is up", "service_unavailable")
        index, cost = choice
        backend = gateway.backends[index]
        gateway.metrics.requests.labels(backend.url).inc()
        upstream = client.build_request("POST", backend.url + path, content=raw, headers=gateway.headers(request))
        ticket = backend.book.send(cost)  # counted from now: a backend answers a non-streamed request at its end
        try:
            response = await _open(client, upstream, backend.book, ticket)
        except httpx.HTTPError:
            backend.up = False  # until a health check finds it answering
            gateway.metrics.failures.labels(backend.url).inc()
            tried.add(index)
            if attempt == 0:
                gateway.metrics.retries.inc()
            continue
        if response.status_code >= 500 and attempt == 0:
            backend.book.done(ticket)
            await response.aclose()
            gateway.metrics.failures.labels(backend.url).inc()
            gateway.metrics.retries.inc()
            tried.add(index)
            continue
        return _passthrough(backend, response, ticket)
    return error(502, "the backends tried did not answer", "bad_gateway")


async def _open(client: httpx.AsyncClient, upstream: httpx.Request, book: LoadBook, ticket: Ticket) -> httpx.Response:
    """The backend's answer to ``upstream`` (its headers); ``ticket`` handed back to ``book`` if it fails."""
    try:
        return await client.send(upstream, stream=True)
    except BaseException:
        book.done(ticket)
        raise


def _passthrough(backend: Backend, response: httpx.Response, ticket: Ticket) -> StreamingResponse:
    streaming = response.headers.get("content-type", "").startswith("text/event-stream")

    async def chunks() -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:  # the backend went away mid-response
            if streaming:
                err = {
                    "error": {
                        "message": f"backend failed mid-stream: {type(exc).__name__}",
                        "type": "bad_gateway",
                        "param": None,
                        "code": 502,
                    }
                }
                yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n".encode()
        finally:
            backend.book.done(ticket)
            await response.aclose()  # a client that went away: the backend sees its connection close

    headers = {k: v for k, v in response.headers.items() if k.lower() not in HOP_HEADERS | {"content-encoding"}}
    return StreamingResponse(chunks(), status_code=response.status_code, headers=headers)


def _models(gateway: Gateway, client: httpx.AsyncClient) -> Handler:
    async def models(request: Request) -> Response:
        if not gateway.authorised(request):
            return error(401, "invalid API key", "authentication_error")
        for backend in (b for b in gateway.backends if b.up):
            try:
                answer = await client.get(backend.url + "/v1/models", headers=gateway.headers(request))
            except httpx.HTTPError:
                continue
            return Response(answer.content, answer.status_code, media_type="application/json")
        return error(503, "no backend is up", "service_unavailable")

    return models


def _health(gateway: Gateway) -> Handler:
    async def health() -> Response:
        up = sum(b.up for b in gateway.backends)
        return Response(status_code=200 if up else 503)

    return health


def _metrics(gateway: Gateway) -> Handler:
    async def metrics() -> Response:
        gateway.metrics.up.set(sum(b.up for b in gateway.backends))
        return Response(generate_latest(gateway.metrics.registry), media_type="text/plain; version=0.0.4")

    return metrics


def _backends(gateway: Gateway) -> Handler:
    async def backends() -> Response:
        rows = [b.row() for b in gateway.backends]
        return JSONResponse({"router": type(gateway.router).__name__, "backends": rows})

    return backends
