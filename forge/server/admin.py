"""``POST /shutdown``: a graceful stop asked over HTTP (vllm-lite's ``/shutdown``).

Only with an API key: the key check of every protected route applies (401 without a valid
key), and a server without keys answers 403, since anyone who can reach it could stop it
otherwise. The answer (202) comes at once; then the server drains while still listening (new
requests get 503, ``/health`` 503, in-flight ones have ``server.shutdown_timeout_s`` to finish,
batch requests in flight stop and run again on the next server), writes its results and exits
with status 0."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from forge.server.protocol import APIError

log = logging.getLogger("forge.server")


class ShutdownControl:
    """``drain`` stops taking requests and waits for the in-flight ones; ``exit_server`` (set by
    whoever runs the server, ``ForgeServer.request_exit``) ends the server once drained; while
    it is unset the server cannot be stopped over HTTP (503)."""

    def __init__(self, drain: Callable[[], Awaitable[None]], has_keys: Callable[[], bool]) -> None:
        self.drain = drain
        self.has_keys = has_keys
        self.exit_server: Callable[[], None] | None = None
        self._task: asyncio.Task[None] | None = None

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
    async def shutdown() -> JSONResponse:
        if not control.has_keys():
            raise APIError(
                "POST /shutdown needs an API key: start the server with server.api_keys or FORGE_API_KEY",
                403,
                "permission_error",
                code="forbidden",
            )
        started = control.request()
        body: dict[str, Any] = {"status": "shutting_down" if started else "already_shutting_down"}
        body["drain_timeout_s"] = timeout_s
        return JSONResponse(body, status_code=202)

    return router
