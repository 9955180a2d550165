"""The engine requests behind one API call (``Generation``): added to the engine together, their
outputs turned into each choice's deltas, and every one still running aborted when the call ends."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from forge.core.outputs import RequestOutput
from forge.sched.fork import output_ids
from forge.server.async_engine import EngineClosed, EngineOverloaded, Item, RequestFailed, Stream
from forge.server.choices import ChoiceSpec, engine_requests
from forge.server.generation import ChoiceText, Delta
from forge.server.protocol import APIError
from forge.server.state import ServerState

log = logging.getLogger("forge.server")


class Generation:
    """The engine requests behind one API call; ``events`` yields each choice's deltas."""

    def __init__(self, state: ServerState, choices: list[ChoiceSpec], prefix: str) -> None:
        self.state = state
        self.queue: Stream = asyncio.Queue()
        self.requests, self.choices = engine_requests(choices, prefix)
        self.texts = {
            rid: ChoiceText(
                state.builder.tokenizer, c.stop_strings, c.params.stop_token_ids, c.include_stop_str, c.min_tokens
            )
            for rid, c in self.choices.items()
        }
        self.pending: set[str] = set()
        # a prompt's first output id (its parent request computes the prompt) -> the prompt's index
        heads = {c.prompt_index: rid for rid, c in reversed(self.choices.items())}
        self._heads = {rid: index for index, rid in heads.items()}
        self._cached: dict[int, int] = {}

    def start(self) -> None:
        """Every request added to the engine; 503 (and none left in it) when it cannot take them."""
        try:
            for request in self.requests:
                self.state.engine.add(request, self.queue)
                self.pending.update(output_ids(request))
        except EngineOverloaded as exc:
            self.close()
            raise APIError(str(exc), 503, "service_unavailable", code="overloaded") from exc
        except EngineClosed as exc:  # its text may quote the engine's failure: logged, not sent
            self.close()
            log.info("request refused: %s", exc)
            message = (
                "the server is shutting down"
                if self.state.draining
                else "the engine has stopped; the server is not taking requests"
            )
            raise APIError(message, 503, "service_unavailable", code="unavailable") from exc

    def close(self) -> None:
        for rid in self.pending:
            self.state.engine.abort(rid)
        self.pending.clear()

    async def events(self) -> AsyncIterator[tuple[ChoiceSpec, ChoiceText, Delta]]:
        """Each choice's deltas as they come (a 500 ``APIError`` if the engine fails a request)."""
        try:
            while self.pending:
                rid, item = await self.queue.get()
                if rid not in self.pending:
                    continue
                out = self._output(rid, item)
                if rid in self._heads:  # its first output's (readmitted after a preemption, it hits its own blocks)
                    self._cached.setdefault(self._heads[rid], out.prompt_cached_tokens)
                text = self.texts[rid]
                delta = text.push(out)
                if delta.finish_reason is not None:
                    self.pending.discard(rid)
                    if not out.finished:
                        self.state.engine.abort(rid, reason="stop")
                yield self.choices[rid], text, delta
        finally:
            self.close()

    def _output(self, rid: str, item: Item) -> RequestOutput:
        """``item`` as the engine's output; a 500 when it is the request's failure."""
        if isinstance(item, RequestFailed):  # forge's own words: what failed, never a library's text
            self.pending.discard(rid)
            raise APIError(f"generation failed: {item}", 500, "internal_error")
        if isinstance(item, BaseException):
            self.pending.discard(rid)
            log.error("request %s failed in the engine", rid, exc_info=item)
            raise APIError("the engine failed while generating this request", 500, "internal_error")
        return item

    async def collect(self) -> dict[int, Delta]:
        """Each choice's deltas merged into one, by choice index (the non-streaming responses)."""
        parts: dict[int, list[Delta]] = {c.index: [] for c in self.choices.values()}
        async for c, _, d in self.events():
            parts[c.index].append(d)
        return {index: Delta.merge(ds) for index, ds in parts.items()}

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache so far: each prompt's, as its first request
        (the one that computes the prompt) reports them in its first output (vLLM counts a request's
        first admission; readmitted after a preemption by recompute, it hits its own blocks)."""
        return sum(self._cached.values())

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens for usage: each distinct prompt once, however many choices share it."""
        return sum(len(c.prompt_ids) for c in {c.prompt_index: c for c in self.choices.values()}.values())
