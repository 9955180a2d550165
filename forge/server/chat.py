"""``POST /v1/chat/completions`` (and batch lines'): the tool plan and rendered prompt, the request's
choices, then its answer whole or streamed, each choice shaped by ``ChatFormat`` (tool calls read back
from the text, ``echo`` of a final assistant message, vLLM's ``prompt_logprobs``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from forge.server.answers import json_answer, sse_answer
from forge.server.bodies import OffLoopBodyRoute
from forge.server.budget import check_output_budget
from forge.server.choices import ChoiceAsk, ChoiceSpec
from forge.server.disconnect import unless_disconnected
from forge.server.engine_call import Generation
from forge.server.generation import ChoiceText, Delta
from forge.server.protocol import APIError, ChatCompletionRequest
from forge.server.responses import chat_logprobs, vllm_prompt_logprobs
from forge.server.state import ServerState
from forge.server.tools import ToolPlan, ToolStream, tool_plan
from forge.tokenizers.base import Tokenizer


class ChatFormat:
    """A chat choice's shapes; ``plan``: the request's tools (their calls are read back from the text)."""

    def __init__(
        self, body: ChatCompletionRequest, tokenizer: Tokenizer, plan: ToolPlan | None, choices: list[ChoiceSpec]
    ) -> None:
        self.body = body
        self.tokenizer = tokenizer
        self.plan = plan
        self.choices = choices
        last = body.messages[-1]
        self.echo = last.text() if body.echo and last.role == "assistant" else ""
        self.tool_streams = {c.index: ToolStream(plan) for c in choices} if plan is not None else {}

    def logprobs(self, d: Delta) -> dict[str, Any] | None:
        return (
            chat_logprobs(self.tokenizer, d.token_ids, d.logprobs, self.body.top_logprobs or 0)
            if self.body.logprobs
            else None
        )

    def head(self) -> list[dict[str, Any]]:
        """The stream's first chunk of each choice: the role (and the echoed text)."""
        role = {"role": "assistant", "content": self.echo}
        return [{"index": c.index, "delta": role, "logprobs": None, "finish_reason": None} for c in self.choices]

    def chunk(self, c: ChoiceSpec, _: ChoiceText, d: Delta) -> dict[str, Any]:
        ts = self.tool_streams.get(c.index)
        reason = d.finish_reason
        # "" while text is held back (vLLM's shape, not an empty delta)
        delta: dict[str, Any] = {"content": d.text if ts is None else ts.push(d.text)}
        if ts is not None and reason is not None:
            rest, calls = ts.finish()
            delta["content"] += rest
            if calls:
                delta["tool_calls"] = [call.body(i) for i, call in enumerate(calls)]
                reason = "tool_calls"
        return {
            "index": c.index,
            "delta": delta,
            "logprobs": self.logprobs(d),
            "finish_reason": reason,
            **self.ids(d),
        }

    def ids(self, d: Delta) -> dict[str, Any]:
        """``return_token_ids`` (vLLM's): the choice's (or delta's) generated ids."""
        return {"token_ids": list(d.token_ids)} if self.body.return_token_ids else {}

    def prompt_ids(self) -> dict[str, Any]:
        """``return_token_ids``: the prompt's ids, once on the response (or the stream's first chunk)."""
        return {"prompt_token_ids": list(self.choices[0].prompt_ids)} if self.body.return_token_ids else {}

    def whole(self, c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        content, calls = self.plan.parse(d.text) if self.plan is not None else (d.text, [])
        message: dict[str, Any] = {"role": "assistant", "content": self.echo + content}
        reason = d.finish_reason
        if calls:
            message["content"] = (self.echo + content) or None
            message["tool_calls"] = [call.body() for call in calls]
            reason = "tool_calls"
        return {
            "index": c.index,
            "message": message,
            "logprobs": self.logprobs(d),
            "finish_reason": reason,
            **self.ids(d),
        }

    def top_level(self, merged: dict[int, Delta]) -> dict[str, Any]:
        """vLLM's chat shape: the prompt's logprobs and ids once, on the response (every choice shares
        the prompt)."""
        k = self.body.prompt_logprobs
        if k is None:
            return self.prompt_ids()
        c = self.choices[0]
        d = merged[c.index]
        plp = vllm_prompt_logprobs(self.tokenizer, c.prompt_ids, d.prompt_logprobs, k, d.prompt_ranks)
        return {"prompt_logprobs": plp, **self.prompt_ids()}


def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> tuple[ToolPlan | None, tuple[list[int], str]]:
    """The tool plan (the tools' schemas checked) and the rendered prompt (on a worker thread)."""
    plan = tool_plan(body, state.settings.tool_call_parser)
    return plan, state.builder.chat_prompt(body, plan.tools if plan is not None else None)


def _check_logprob_fields(body: ChatCompletionRequest) -> None:
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    if body.prompt_logprobs is not None and body.stream:
        raise APIError("prompt_logprobs is returned by non-streaming chat completions only", param="prompt_logprobs")


async def chat_choices(state: ServerState, body: ChatCompletionRequest) -> tuple[ToolPlan | None, list[ChoiceSpec]]:
    """As ``completion_choices``: the checks, the tool schemas' checks and the template render run on
    a worker thread."""
    await asyncio.to_thread(state.check_body, body)
    _check_logprob_fields(body)
    plan, prompt = await asyncio.to_thread(_chat_prompt, state, body)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    ask = ChoiceAsk(
        max_tokens,
        None,
        (body.top_logprobs or 0) if body.logprobs else None,
        plan.spec if plan is not None else None,
        body.prompt_logprobs,
    )
    choices = await state.builder.choices(body, [prompt], ask)
    check_output_budget(choices, state.settings.max_output_units)
    return plan, choices


async def create_chat(state: ServerState, body: ChatCompletionRequest) -> Response:
    """The answer to ``body`` (the route's and a batch line's)."""
    plan, choices = await chat_choices(state, body)
    cid = state.builder.next_id("chatcmpl")
    gen = Generation(state, choices, cid)
    gen.start()
    fmt = ChatFormat(body, state.builder.tokenizer, plan, choices)
    base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        return sse_answer(gen, base, body.stream_options, fmt, fmt.head(), fmt.prompt_ids())
    return await json_answer(gen, {**base, "object": "chat.completion"}, fmt, fmt.top_level)


def chat_router(state: ServerState) -> APIRouter:
    router = APIRouter(route_class=OffLoopBodyRoute)

    @router.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await unless_disconnected(request, create_chat(state, body))

    return router
