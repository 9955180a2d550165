"""``POST /v1/completions`` (and the completions behind ``/generate`` and batch lines): the request's
choices, then its answer whole, streamed, or the best of ``best_of``, each choice shaped by
``CompletionFormat``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from forge.server.answers import best_of_answer, json_answer, sse_answer
from forge.server.bodies import OffLoopBodyRoute
from forge.server.budget import check_output_budget
from forge.server.choices import ChoiceAsk, ChoiceSpec
from forge.server.disconnect import unless_disconnected
from forge.server.engine_call import Generation
from forge.server.generation import ChoiceText, Delta
from forge.server.protocol import APIError, CompletionRequest
from forge.server.responses import completion_logprobs, echo_logprobs, joined_logprobs, vllm_prompt_logprobs
from forge.server.sequences import SequencePlan, sequence_plan
from forge.server.state import ServerState
from forge.tokenizers.base import Tokenizer

DEFAULT_MAX_TOKENS = 16  # OpenAI's for completions


class CompletionFormat:
    """A completions choice's shapes: ``echo`` puts the prompt (and, with ``logprobs``, its logprobs)
    before the generated text; ``token_ids``: a whole choice also carries its generated ids; with
    ``return_token_ids`` (vLLM's) every choice and chunk carries its ids, and a choice's first its
    prompt's (``prompt_token_ids``)."""

    def __init__(self, body: CompletionRequest, tokenizer: Tokenizer, token_ids: bool) -> None:
        self.body = body
        self.tokenizer = tokenizer
        self.token_ids = token_ids or body.return_token_ids
        self.k = body.logprobs or 0
        self.started: set[int] = set()  # streamed choices whose first chunk has been sent

    def echo_text(self, c: ChoiceSpec) -> str:
        """The prompt as given: its text, or its token ids decoded with their special tokens (the
        echoed tokens' strings keep them, and their offsets index this text)."""
        if not self.body.echo:
            return ""
        if c.prompt_text is not None:
            return c.prompt_text
        return self.tokenizer.decode(c.prompt_ids, skip_special_tokens=False)

    def logprobs(self, c: ChoiceSpec, d: Delta, offset: int, first: bool) -> dict[str, Any] | None:
        """The delta's logprobs object; on a choice's first delta with echo, the prompt's before them."""
        if self.body.logprobs is None:
            return None
        generated = completion_logprobs(self.tokenizer, d.token_ids, d.logprobs, self.k, offset)
        if not (self.body.echo and first):
            return generated
        return joined_logprobs(echo_logprobs(self.tokenizer, c.prompt_ids, d.prompt_logprobs, self.k), generated)

    def prompt_logprobs(self, c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        k = self.body.prompt_logprobs
        if k is None:
            return {}
        plp = vllm_prompt_logprobs(self.tokenizer, c.prompt_ids, d.prompt_logprobs, k, d.prompt_ranks)
        return {"prompt_logprobs": plp}

    def ids(self, c: ChoiceSpec, d: Delta, first: bool) -> dict[str, Any]:
        """``return_token_ids``: the delta's ids, and on a choice's first the prompt's."""
        if not self.body.return_token_ids:
            return {}
        return {**({"prompt_token_ids": list(c.prompt_ids)} if first else {}), "token_ids": list(d.token_ids)}

    def chunk(self, c: ChoiceSpec, text: ChoiceText, d: Delta) -> dict[str, Any]:
        first = c.index not in self.started
        self.started.add(c.index)
        echo = self.echo_text(c)
        # offsets count the echoed prompt too, as the whole response's do
        logprobs = self.logprobs(c, d, text.sent - len(d.text) + len(echo), first)
        return {
            "index": c.index,
            "text": (echo if first else "") + d.text,
            "logprobs": logprobs,
            "finish_reason": d.finish_reason,
            **(self.prompt_logprobs(c, d) if first else {}),
            **self.ids(c, d, first),
        }

    def whole(self, c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        echo = self.echo_text(c)
        return {
            "index": c.index,
            "text": echo + d.text,
            "logprobs": self.logprobs(c, d, len(echo), True),
            "finish_reason": d.finish_reason,
            "stop_reason": None,
            **self.prompt_logprobs(c, d),
            **({"prompt_token_ids": list(c.prompt_ids)} if self.body.return_token_ids else {}),
            **({"token_ids": list(d.token_ids)} if self.token_ids else {}),
        }


def completion_ask(body: CompletionRequest, plan: SequencePlan) -> ChoiceAsk:
    """What the engine must return: with ``echo`` and ``logprobs`` the prompt tokens' logprobs too;
    with ``best_of`` the sampled tokens' logprobs (it ranks by them) even when not asked for."""
    echo_k = body.logprobs if body.echo else None
    prompt_k = max((k for k in (body.prompt_logprobs, echo_k) if k is not None), default=None)
    engine_k = body.logprobs if body.logprobs is not None or not plan.picks_best else 0
    return ChoiceAsk(body.max_tokens, DEFAULT_MAX_TOKENS, engine_k, None, prompt_k, plan.num_sequences, plan.beam)


async def completion_choices(state: ServerState, body: CompletionRequest) -> tuple[SequencePlan, list[ChoiceSpec]]:
    """The body checked and its choices; what costs CPU in proportion to the body (checks,
    tokenizing) runs on a worker thread."""
    await asyncio.to_thread(state.check_body, body)
    if body.suffix:
        raise APIError("suffix is not supported", param="suffix")
    plan = sequence_plan(body, state.settings.max_n)
    prompts = await asyncio.to_thread(state.builder.completion_prompts, body)
    choices = await state.builder.choices(body, prompts, completion_ask(body, plan))
    check_output_budget(choices, state.settings.max_output_units, echo=body.echo)
    return plan, choices


async def create_completion(state: ServerState, body: CompletionRequest, token_ids: bool = False) -> Response:
    """The answer to ``body`` (the route's, ``/generate``'s and a batch line's). ``token_ids``: each
    non-streamed choice also carries its generated ids (``/generate``'s ``tokens``)."""
    plan, choices = await completion_choices(state, body)
    cid = state.builder.next_id("cmpl")
    gen = Generation(state, choices, cid)
    gen.start()
    fmt = CompletionFormat(body, state.builder.tokenizer, token_ids)
    base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        return sse_answer(gen, base, body.stream_options, fmt)
    if plan.picks_best:
        return await best_of_answer(gen, base, fmt, plan.n)
    return await json_answer(gen, base, fmt)


def completions_router(state: ServerState) -> APIRouter:
    router = APIRouter(route_class=OffLoopBodyRoute)

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await unless_disconnected(request, create_completion(state, body))

    return router
