"""A generation's answer as HTTP: the whole body (``json_answer``, ``best_of_answer``) or an SSE stream
(``sse_answer``); each endpoint gives the shape of its choices (a ``ChoiceFormat``)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from fastapi.responses import JSONResponse, StreamingResponse

from forge.server.choices import ChoiceSpec
from forge.server.engine_call import Generation
from forge.server.generation import ChoiceText, Delta
from forge.server.protocol import APIError, StreamOptions
from forge.server.responses import SSE_DONE, sse, usage
from forge.server.sequences import best_choices

Body = dict[str, Any]


class ChoiceFormat(Protocol):
    """An endpoint's choice shapes: ``chunk`` one streamed delta's, ``whole`` a finished choice's."""

    def chunk(self, choice: ChoiceSpec, text: ChoiceText, delta: Delta) -> Body: ...

    def whole(self, choice: ChoiceSpec, delta: Delta) -> Body: ...


def _body(gen: Generation, base: Body, choices: list[Body], merged: dict[int, Delta], extra: Body) -> JSONResponse:
    n_out = sum(len(d.token_ids) for d in merged.values())
    counts = usage(gen.prompt_tokens, n_out, gen.cached_tokens)
    return JSONResponse({**base, "choices": choices, "usage": counts, **extra})


async def json_answer(
    gen: Generation, base: Body, fmt: ChoiceFormat, top_level: Callable[[dict[int, Delta]], Body] | None = None
) -> JSONResponse:
    """The non-streaming body of one call: each choice whole, the usage, and the fields ``top_level``
    derives from the merged choices (by index)."""
    merged = await gen.collect()
    out = [fmt.whole(c, merged[c.index]) for c in gen.choices.values()]
    return _body(gen, base, out, merged, top_level(merged) if top_level is not None else {})


async def best_of_answer(gen: Generation, base: Body, fmt: ChoiceFormat, n: int) -> JSONResponse:
    """The ``n`` best of each prompt's ``best_of`` sequences; the usage counts every sequence
    sampled (OpenAI's)."""
    merged = await gen.collect()
    choices = list(gen.choices.values())
    picked = [{**fmt.whole(c, merged[c.index]), "index": i} for i, c in best_choices(choices, merged, n)]
    return _body(gen, base, picked, merged, {})


class _UsageChunks:
    """What ``stream_options`` asks of a stream's usage: a final usage chunk (``include_usage``) and
    the usage so far on every chunk (``continuous_usage_stats``, vLLM's: only with ``include_usage``)."""

    def __init__(self, options: StreamOptions | None, gen: Generation) -> None:
        self.final = options is not None and options.include_usage
        self.continuous = self.final and options is not None and options.continuous_usage_stats
        self.gen = gen

    def so_far(self, n_out: int) -> Body:
        if self.continuous:
            return {"usage": usage(self.gen.prompt_tokens, n_out, self.gen.cached_tokens)}
        return {"usage": None} if self.final else {}


async def _events(
    gen: Generation, base: Body, fmt: ChoiceFormat, head: list[Body], counts: _UsageChunks, first: Body
) -> AsyncIterator[str]:
    for i, choice in enumerate(head):
        yield sse({**base, "choices": [choice], **counts.so_far(0), **(first if i == 0 else {})})
    n_out = 0
    try:
        async for c, text, d in gen.events():
            n_out += len(d.token_ids)
            yield sse({**base, "choices": [fmt.chunk(c, text, d)], **counts.so_far(n_out)})
    except APIError as err:
        yield sse(err.body())
    if counts.final:
        yield sse({**base, "choices": [], "usage": usage(gen.prompt_tokens, n_out, gen.cached_tokens)})
    yield SSE_DONE


def sse_answer(
    gen: Generation,
    base: Body,
    options: StreamOptions | None,
    fmt: ChoiceFormat,
    head: list[Body] | None = None,
    first: Body | None = None,
) -> StreamingResponse:
    """The SSE stream of one call: the ``head`` choices (the first of them also carrying the fields
    ``first``), one chunk per delta, an error chunk if the engine fails, the usage chunk when
    ``stream_options.include_usage``, then ``[DONE]``. With ``include_usage`` and
    ``continuous_usage_stats`` every chunk carries the usage so far."""
    counts = _UsageChunks(options, gen)
    events = _events(gen, base, fmt, head or [], counts, first or {})
    return StreamingResponse(events, media_type="text/event-stream")
