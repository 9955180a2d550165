"""``POST /generate``: forge-infer's native shape, a thin alias over ``/v1/completions``.

``{"prompt": str, "max_tokens": int = 32}`` -> ``{"text", "tokens", "prompt_tokens",
"completion_tokens"}``: ``tokens`` the generated token ids (issue 18's shape), the two counts
forge-infer's ``server.rs``'s. Greedy (forge-infer's model is deterministic), not streamed
(forge-infer's ``/generate`` is not; ``/v1/completions`` streams). Any other field is refused
with a 400. The body is read as JSON whatever its ``Content-Type``, so forge-infer's own example
(``curl -d '{...}'``, which sends ``application/x-www-form-urlencoded``) works unchanged."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from forge.server.disconnect import CLIENT_CLOSED, unless_disconnected
from forge.server.errors import validation_error
from forge.server.protocol import APIError, CompletionRequest, GenerateRequest

_BODY_SCHEMA = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": GenerateRequest.model_json_schema()}},
    }
}


def generate_router(complete: Callable[[CompletionRequest], Awaitable[Response]], model_name: str) -> APIRouter:
    """``complete``: non-streamed completions whose choices carry their ``token_ids``."""
    router = APIRouter()

    @router.post("/generate", openapi_extra=_BODY_SCHEMA)
    async def generate(request: Request) -> Response:
        try:
            raw = json.loads(await request.body())
        except ValueError:
            raise APIError("the request body is not valid JSON") from None
        try:
            body = GenerateRequest.model_validate(raw)
        except ValidationError as exc:
            raise validation_error(exc.errors()) from None
        completion = CompletionRequest(
            model=model_name, prompt=body.prompt, max_tokens=body.max_tokens, temperature=0.0
        )
        response = await unless_disconnected(request, complete(completion))
        if response.status_code == CLIENT_CLOSED:
            return response
        answer: dict[str, Any] = json.loads(bytes(response.body))
        usage = answer["usage"]
        return JSONResponse(
            {
                "text": answer["choices"][0]["text"],
                "tokens": answer["choices"][0]["token_ids"],
                "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"],
            }
        )

    return router
