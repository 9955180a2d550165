"""``POST /shutdown``: a graceful stop asked over HTTP (vllm-lite's ``/shutdown``).

Only with the admin key (``server.admin_key`` or ``$FORGE_ADMIN_KEY``), sent as
``Authorization: Bearer <admin key>``; the API keys of the other routes do not open it, and the
route is not rate limited. A server without an admin key answers 403 to everyone (anyone who
can reach it could stop it otherwise); with one, a request without a bearer key gets 401 (as
every protected route does) and a wrong key, an API key included, 403. The answer (202) comes at
once; then the server drains while still listening (new requests get 503, ``/health`` 503,
in-flight ones have ``server.shutdown_timeout_s`` to finish, batch requests in flight stop and
run again on the next server), writes its results and exits with status 0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Header
from fastapi.responses import JSONResponse

from forge.server.auth import bearer_key, key_is_valid
from forge.server.protocol import APIError

log = logging.getLogger("forge.server")


class ShutdownControl:
    """``drain`` stops taking requests and waits for the in-flight ones; ``exit_server`` (set by
    whoever runs the server, ``ForgeServer.request_exit``) ends the server once drained; while
    it is unset the server cannot be stopped over HTTP (503). ``admin_keys`` gives the keys
    that may ask for it (read on each request, so ``$FORGE_ADMIN_KEY`` is the live value)."""

    def __init__(self, drain: Callable[[], Awaitable[None]], admin_keys: Callable[[], frozenset[str]]) -> None:
        self.drain = drain
        self.admin_keys = admin_keys
        self.exit_server: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None

    def check(self, authorization: str | None) -> None:
        """Raise the 403 or 401 ``APIError`` unless ``authorization`` carries an admin key."""
        keys = self.admin_keys()
        if not keys:
            raise APIError(
                "POST /shutdown needs an admin key: start the server with server.admin_key or FORGE_ADMIN_KEY",
                403,
                "permission_error",
                code="forbidden",
            )
        key = bearer_key(authorization)
        if key is None:
            raise APIError(
                "missing admin key (Authorization: Bearer ...)", 401, "authentication_error", code="invalid_api_key"
            )
        if not key_is_valid(key, keys):
            raise APIError("this key is not the admin key", 403, "permission_error", code="forbidden")

    def request(self) -> bool:
        """Start the shutdown; False when one is already under way."""
        if self.exit_server is None:
            raise APIError("this server cannot be stopped over HTTP", 503, "service_unavailable")
        if self._task is not None:
            return False
        self._task = asyncio.create_task(self._run(self.exit_server), name="forge-shutdown")
        return True

    async def _run(self, exit_server: Callable[[], None]) -> None:
        log.info("shutdown requested over HTTP: draining")
        try:
            await self.drain()
        finally:
            exit_server()


def admin_router(control: ShutdownControl, timeout_s: float) -> APIRouter:
    router = APIRouter()

    @router.post("/shutdown", status_code=202)
    async def shutdown(authorization: str | None = Header(default=None, include_in_schema=False)) -> JSONResponse:
        control.check(authorization)
        started = control.request()
        body: dict[str, Any] = {"status": "shutting_down" if started else "already_shutting_down"}
        body["drain_timeout_s"] = timeout_s
        return JSONResponse(body, status_code=202)

    return router
