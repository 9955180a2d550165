"""``POST /v1/embeddings`` in OpenAI's shape.

Each input becomes one embedding request (``forge.core.pooling``): a prompt-only request that
runs through the engine's scheduler with the generation traffic, samples nothing, and finishes
with its prompt's final hidden states pooled as the ``embedding`` config group says. Every input
is checked before any reaches the engine (400 in OpenAI's error shape)."""

from __future__ import annotations

import asyncio
import base64
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response

from forge.core.pooling import PoolingParams
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.server.async_engine import AsyncEngine, EngineClosed, EngineOverloaded, RequestFailed, Stream
from forge.server.bodies import OffLoopBodyRoute
from forge.server.budget import check_embedding_budget
from forge.server.checks import check_encodable, check_model
from forge.server.disconnect import unless_disconnected
from forge.server.protocol import APIError, EmbeddingRequest
from forge.server.request_limits import EngineLimits
from forge.tokenizers.base import Tokenizer

if TYPE_CHECKING:
    from forge.engine.engine import Engine
    from forge.server.state import ServerState

log = logging.getLogger("forge.server")
MAX_INPUTS = 2048  # OpenAI's limit on inputs per request


@dataclass(frozen=True)
class EmbeddingService:
    """What the route needs of the server: the engine, the tokenizer and limits the inputs are
    checked against, the served name, the pooling, the model's hidden size (the embedding's length),
    whether the server is draining (for the 503's words) and the output budget (``forge.server.budget``)."""

    engine: AsyncEngine
    tokenizer: Tokenizer
    limits: EngineLimits
    model_name: str
    pooling: PoolingParams
    hidden_size: int
    draining: Callable[[], bool]
    max_output_units: int

    def prompts(self, body: EmbeddingRequest) -> list[list[int]]:
        """The token ids of each input, checked: not empty, in the vocabulary, within the limits."""
        raw = body.input
        items: list[Any] = [raw] if isinstance(raw, str) else list(raw)
        if not items:
            raise APIError("input must not be empty", param="input")
        if items and isinstance(items[0], int):
            items = [items]  # one prompt given as token ids
        if len(items) > MAX_INPUTS:
            raise APIError(f"at most {MAX_INPUTS} inputs per request, got {len(items)}", param="input")
        check_embedding_budget(len(items), self.hidden_size, self.max_output_units)
        prompts = []
        for i, item in enumerate(items):
            where = "input" if len(items) == 1 else f"input[{i}]"
            ids = self.tokenizer.encode(item) if isinstance(item, str) else list(item)
            if not item:  # an empty string too, though encoding may give it a BOS token
                raise APIError(f"{where} is empty", param="input")
            bad = next((t for t in ids if t >= self.limits.vocab_size), None)
            if bad is not None:
                raise APIError(f"{where}: token id {bad} is outside the vocabulary", param="input")
            limit = min(self.limits.max_model_len, self.limits.kv_capacity_tokens)
            if len(ids) > limit:
                raise APIError(
                    f"{where} has {len(ids)} tokens, more than this model's maximum context length of {limit}",
                    param="input",
                )
            prompts.append(ids)
        return prompts

    async def embed(self, prompts: list[list[int]], prefix: str, priority: int = 0) -> list[list[float]]:
        """Each prompt's embedding, through the engine (at ``priority``, for policies that read it); the
        requests still running are aborted if the caller goes away."""
        stream: Stream = asyncio.Queue()
        pending: dict[str, int] = {}
        out: list[list[float] | None] = [None] * len(prompts)
        try:
            for i, ids in enumerate(prompts):
                rid = f"{prefix}-{i}"
                request = Request(
                    rid, ids, SamplingParams(max_tokens=1), priority=priority, pooling_params=self.pooling
                )
                self.engine.add(request, stream)
                pending[rid] = i
            while pending:
                rid, item = await stream.get()
                if rid not in pending:
                    continue
                index = pending.pop(rid)
                if isinstance(item, RequestFailed):
                    raise APIError(f"embedding failed: {item}", 500, "internal_error")
                if isinstance(item, ValueError):  # the engine refused it (forge's own words)
                    raise APIError(str(item), param="input")
                if isinstance(item, BaseException):
                    log.error("request %s failed in the engine", rid, exc_info=item)
                    raise APIError("the engine failed while embedding this input", 500, "internal_error")
                if item.embedding is None:  # aborted (the server is shutting down)
                    raise APIError("the server is shutting down", 503, "service_unavailable", code="unavailable")
                out[index] = item.embedding
        except EngineOverloaded as exc:
            raise APIError(str(exc), 503, "service_unavailable", code="overloaded") from exc
        except EngineClosed as exc:  # its text may quote the engine's failure: logged, not sent
            log.info("request refused: %s", exc)
            message = "the server is shutting down" if self.draining() else "the engine has stopped"
            raise APIError(message, 503, "service_unavailable", code="unavailable") from exc
        finally:
            for rid in pending:
                self.engine.abort(rid)
        return [e for e in out if e is not None]


def encode(vector: list[float], encoding_format: str) -> list[float] | str:
    """OpenAI's encodings: float32 values as numbers, or their little-endian bytes in base64."""
    values = np.asarray(vector, dtype="<f4")
    if encoding_format == "base64":
        return base64.b64encode(values.tobytes()).decode("ascii")
    as_list: list[float] = values.tolist()
    return as_list


def embedding_service(
    state: ServerState, engine: Engine, limits: EngineLimits, pooling: PoolingParams
) -> EmbeddingService:
    """The service over the app's state and the engine it serves (read here, on the loop, before it starts)."""
    return EmbeddingService(
        state.engine,
        engine.tokenizer,
        limits,
        state.model_name,
        pooling,
        engine.runner.model.dims.hidden_size,
        lambda: state.draining,
        state.settings.max_output_units,
    )


async def create_embeddings(service: EmbeddingService, body: EmbeddingRequest, request_id: str) -> JSONResponse:
    """OpenAI's ``/v1/embeddings`` answer to ``body`` (the route's and a batch line's); ``user`` is
    accepted and changes nothing. The inputs' checks and tokenizing, and the answer's JSON, run on a
    worker thread (2,048 inputs, or as many vectors, would hold up the event loop)."""
    body.check_known_fields()
    check_model(body.model, service.model_name)
    await asyncio.to_thread(check_encodable, body)
    if body.dimensions is not None and body.dimensions != service.hidden_size:
        raise APIError(
            f"dimensions={body.dimensions} is not supported: this model's embeddings have "
            f"{service.hidden_size} dimensions and are not trained to be truncated",
            param="dimensions",
        )
    prompts = await asyncio.to_thread(service.prompts, body)
    vectors = await service.embed(prompts, request_id, body.priority)
    return await asyncio.to_thread(_answer, service, body, prompts, vectors)


def _answer(
    service: EmbeddingService, body: EmbeddingRequest, prompts: list[list[int]], vectors: list[list[float]]
) -> JSONResponse:
    data = [
        {"object": "embedding", "index": i, "embedding": encode(v, body.encoding_format)} for i, v in enumerate(vectors)
    ]
    n = sum(map(len, prompts))
    return JSONResponse(
        {
            "object": "list",
            "data": data,
            "model": service.model_name,
            "usage": {"prompt_tokens": n, "total_tokens": n},
        }
    )


def embeddings_router(service: EmbeddingService) -> APIRouter:
    """The ``/v1/embeddings`` route, and (``handler``) the same answer for batch lines."""
    router = APIRouter(route_class=OffLoopBodyRoute)
    ids = itertools.count()

    @router.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest, request: HTTPRequest) -> Response:
        return await unless_disconnected(request, create_embeddings(service, body, f"embd-{next(ids)}"))

    return router
