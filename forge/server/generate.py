"""``POST /generate``: forge-infer's native shape, a thin alias over ``/v1/completions``.

``{"prompt": str, "max_tokens": int = 32}`` -> ``{"text", "prompt_tokens", "completion_tokens"}``,
greedy (forge-infer's model is deterministic), not streamed (forge-infer's ``/generate`` is not;
``/v1/completions`` streams). Any other field is refused with a 400."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from forge.server.protocol import CompletionRequest, GenerateRequest


def generate_router(complete: Callable[[CompletionRequest], Awaitable[Response]], model_name: str) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(body: GenerateRequest) -> Response:
        request = CompletionRequest(model=model_name, prompt=body.prompt, max_tokens=body.max_tokens, temperature=0.0)
        response = await complete(request)
        answer: dict[str, Any] = json.loads(bytes(response.body))
        usage = answer["usage"]
        return JSONResponse(
            {
                "text": answer["choices"][0]["text"],
                "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"],
            }
        )

    return router
