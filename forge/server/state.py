"""What every route of the app shares (``ServerState``), and the guard that checks API keys and rate
limits before a body is read (``AccessGuard``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from forge.server.async_engine import AsyncEngine
from forge.server.auth import RateLimiter, bearer_key, key_is_valid
from forge.server.batch_lines import Handler
from forge.server.batches import BatchRunner
from forge.server.builder import RequestBuilder
from forge.server.errors import error_response
from forge.server.metrics import ServerMetrics
from forge.server.nesting import check_embedded_json
from forge.server.protocol import APIError, SamplingFields
from forge.server.settings import ServerSettings

PROTECTED = ("/v1/", "/tokenize", "/detokenize", "/generate")  # /shutdown: the admin key (admin.py)


@dataclass
class ServerState:
    engine: AsyncEngine
    builder: RequestBuilder
    settings: ServerSettings
    metrics: ServerMetrics
    limiter: RateLimiter
    model_name: str
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    # what a batch line may call, by endpoint path (the routes' own functions, no HTTP)
    handlers: dict[str, Handler] = field(default_factory=dict)
    batches: BatchRunner | None = None

    def check_access(self, authorization: str | None, client: str) -> APIError | None:
        """401 without a valid key (when keys are set); 429 past the rate limit, which is per
        validated key, or per client address when auth is off (a made-up bearer token must not
        buy a fresh bucket)."""
        keys = self.settings.keys()
        key = bearer_key(authorization)
        if keys and (key is None or not key_is_valid(key, keys)):
            msg = "missing API key (Authorization: Bearer ...)" if key is None else "invalid API key"
            return APIError(msg, 401, "authentication_error", code="invalid_api_key")
        wait = self.limiter.check(f"key:{key}" if keys else f"client:{client}")
        if wait:
            return APIError(
                f"rate limit exceeded ({self.limiter.rate:g} requests/s); retry after {wait} s",
                429,
                "rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
            )
        return None

    def check_body(self, body: SamplingFields) -> None:
        """The checks that walk a whole completions or chat body (run on a worker thread: a body
        may hold megabytes)."""
        self.builder.check_common(body)
        check_embedded_json(body, self.settings.max_json_nesting)

    async def drain(self) -> None:
        """Shutdown's first step: /health turns 503, new requests get 503, in-flight ones have
        ``shutdown_timeout_s`` to finish and are then aborted (each stream's last chunk says
        ``finish_reason="abort"``, then ``[DONE]``)."""
        self.draining = True
        if self.batches is not None:  # batch requests in flight stop here and run again on restart
            await self.batches.stop()
        await self.engine.shutdown(self.settings.shutdown_timeout_s)


class AccessGuard:
    """API keys and rate limits, checked before the body is read (pure ASGI, so streaming and
    client disconnects pass through untouched)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PROTECTED):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            client = scope.get("client") or ("?", 0)
            err = self.state.check_access(headers.get("authorization"), str(client[0]))
            if err is not None:
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)
