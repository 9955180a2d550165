"""``GET /health``, ``GET /metrics`` and ``GET /v1/models`` (each also answers HEAD)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from forge.server.bodies import OffLoopBodyRoute
from forge.server.state import ServerState

Endpoint = Callable[..., Any]


def _get(router: APIRouter, path: str, response_class: type[Response] = JSONResponse) -> Callable[[Endpoint], Endpoint]:
    """A GET route that also answers HEAD (the schema lists the GET only, and a 405's ``Allow`` names it)."""

    def register(endpoint: Endpoint) -> Endpoint:
        router.get(path, response_class=response_class)(endpoint)
        router.head(path, response_class=response_class, include_in_schema=False)(endpoint)
        return endpoint

    return register


def service_router(state: ServerState, vocab_size: int, eos_token_ids: list[int]) -> APIRouter:
    router = APIRouter(route_class=OffLoopBodyRoute)

    @_get(router, "/health", response_class=Response)
    async def health() -> Response:
        """200 with an empty body while the server takes requests; 503 once draining or failed."""
        ok = state.engine.healthy and not state.draining
        return Response(status_code=200 if ok else 503)

    @_get(router, "/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @_get(router, "/v1/models")
    async def models() -> dict[str, Any]:
        name = state.model_name
        card = {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "forge",
            "root": name,
            "max_model_len": state.max_model_len,
            "vocab_size": vocab_size,
            "eos_token_ids": eos_token_ids,
        }
        return {"object": "list", "data": [card]}

    return router
