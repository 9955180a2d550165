"""``POST /tokenize`` and ``POST /detokenize`` (vLLM's shapes).

``/tokenize`` takes a ``prompt``, or ``messages`` (and ``tools``) rendered by the chat template as
chat completions render them; ``/detokenize`` takes token ids (integers: ``"5"``, ``5.0`` and
``true`` are refused). Unknown fields are refused with a 400 naming them. Everything after the body
is parsed (schema checks, the template render, the tokenizer, the answer's JSON) runs on a worker
thread: a request holding megabytes of text or schema never holds up the event loop, so
``/health`` and other clients' streams keep answering while it is prepared."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from forge.server.bodies import OffLoopBodyRoute
from forge.server.builder import RequestBuilder
from forge.server.checks import check_encodable, check_model
from forge.server.nesting import check_embedded_json
from forge.server.protocol import APIError, ChatCompletionRequest, DetokenizeRequest, TokenizeRequest
from forge.server.request_limits import EngineLimits
from forge.server.token_only import needs_tokenizer
from forge.server.tools import tool_plan


def tokenize_router(builder: RequestBuilder, limits: EngineLimits, model_name: str, max_nesting: int) -> APIRouter:
    """The two routes over the server's request builder (its tokenizer and chat rendering)."""
    router = APIRouter(route_class=OffLoopBodyRoute)
    tokenizer = builder.tokenizer

    def tokens(body: TokenizeRequest) -> JSONResponse:
        check_model(body.model, model_name)
        body.check_known_fields()
        if not builder.has_text:
            raise needs_tokenizer("/tokenize", None)
        check_encodable(body)
        check_embedded_json(body, max_nesting)
        if (body.prompt is None) == (body.messages is None):
            raise APIError("give exactly one of prompt and messages", param="prompt")
        if body.prompt is not None:
            ids = tokenizer.encode(body.prompt, add_special_tokens=body.add_special_tokens)
        else:
            chat = ChatCompletionRequest(
                model=model_name,
                messages=body.messages or [],
                add_generation_prompt=body.add_generation_prompt,
                tools=body.tools,
                tool_choice="none" if body.tools else None,
            )
            plan = tool_plan(chat, None)
            ids, _ = builder.chat_prompt(chat, plan.tools if plan is not None else None)
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": limits.max_model_len})

    def text(body: DetokenizeRequest) -> JSONResponse:
        check_model(body.model, model_name)
        body.check_known_fields()
        if not builder.has_text:
            raise needs_tokenizer("/detokenize", None)
        bad = [t for t in body.tokens if not 0 <= t < limits.vocab_size]
        if bad:
            raise APIError(f"token id {bad[0]} is outside the vocabulary", param="tokens")
        return JSONResponse({"prompt": tokenizer.decode(body.tokens)})

    @router.post("/tokenize", response_model=dict[str, Any])
    async def tokenize(body: TokenizeRequest) -> JSONResponse:
        return await asyncio.to_thread(tokens, body)

    @router.post("/detokenize", response_model=dict[str, Any])
    async def detokenize(body: DetokenizeRequest) -> JSONResponse:
        return await asyncio.to_thread(text, body)

    return router
