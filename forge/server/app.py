"""The OpenAI-compatible HTTP front end: ``python run.py mode=serve``.

Routes: POST /v1/completions, POST /v1/chat/completions (SSE when ``stream``), POST /v1/embeddings
(``embeddings``), GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize;
/v1/files and /v1/batches (``files``, ``batches``), POST /generate (``generate``), POST /shutdown
(``admin``), GET /version (``version``). Every request is validated by ``RequestBuilder`` before
anything reaches the engine (4xx in OpenAI's error shape); the engine runs on its own thread
(``AsyncEngine``)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from hydra.utils import instantiate
from omegaconf import DictConfig
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Receive, Scope, Send

from forge.core.pooling import PoolingParams
from forge.engine.engine import Engine
from forge.sched.fork import output_ids
from forge.server.admin import ShutdownControl, admin_router
from forge.server.async_engine import AsyncEngine, EngineClosed, EngineOverloaded, RequestFailed, Stream
from forge.server.auth import RateLimiter, bearer_key, key_is_valid
from forge.server.batch_lines import Handler, json_handler
from forge.server.batch_routes import batches_router
from forge.server.batch_store import BatchStore
from forge.server.batches import BatchRunner
from forge.server.bodies import OffLoopBodyRoute
from forge.server.budget import check_output_budget
from forge.server.disconnect import unless_disconnected
from forge.server.embeddings import create_embeddings, embedding_service, embeddings_router
from forge.server.errors import ERROR_RESPONSES, error_response, install_error_handlers
from forge.server.files import FileStore, files_router
from forge.server.generate import generate_router
from forge.server.generation import (
    ChoiceSpec,
    ChoiceText,
    Delta,
    EngineLimits,
    RequestBuilder,
    engine_requests,
)
from forge.server.launch import ForgeServer, uvicorn_config
from forge.server.limits import BodyLimits
from forge.server.metrics import ServerMetrics
from forge.server.nesting import check_embedded_json
from forge.server.owners import Owners
from forge.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    SamplingFields,
    StreamOptions,
)
from forge.server.responses import (
    SSE_DONE,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    joined_logprobs,
    sse,
    usage,
    vllm_prompt_logprobs,
)
from forge.server.sequences import best_choices, sequence_plan
from forge.server.settings import ServerSettings
from forge.server.tokenize import tokenize_router
from forge.server.tools import ToolPlan, ToolStream, tool_plan
from forge.server.version import version_router
from forge.structured.base import StructuredBackend
from forge.structured.compile_pool import CompilePool

log = logging.getLogger("forge.server")
_PROTECTED = ("/v1/", "/tokenize", "/detokenize", "/generate")  # /shutdown: the admin key (admin.py)


@dataclass
class ServerState:
    engine: AsyncEngine
    builder: RequestBuilder
    settings: ServerSettings
    metrics: ServerMetrics
    limiter: RateLimiter
    model_name: str
    max_model_len: int
    created: int = field(default_factory=lambda: int(time.time()))
    draining: bool = False
    # what a batch line may call, by endpoint path (the routes' own functions, no HTTP)
    handlers: dict[str, Handler] = field(default_factory=dict)
    batches: BatchRunner | None = None

    def check_access(self, authorization: str | None, client: str) -> APIError | None:
        """401 without a valid key (when keys are set); 429 past the rate limit, which is per
        validated key, or per client address when auth is off (a made-up bearer token must not
        buy a fresh bucket)."""
        keys = self.settings.keys()
        key = bearer_key(authorization)
        if keys and (key is None or not key_is_valid(key, keys)):
            msg = "missing API key (Authorization: Bearer ...)" if key is None else "invalid API key"
            return APIError(msg, 401, "authentication_error", code="invalid_api_key")
        wait = self.limiter.check(f"key:{key}" if keys else f"client:{client}")
        if wait:
            return APIError(
                f"rate limit exceeded ({self.limiter.rate:g} requests/s); retry after {wait} s",
                429,
                "rate_limit_error",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
            )
        return None

    async def drain(self) -> None:
        """Shutdown's first step: /health turns 503, new requests get 503, in-flight ones have
        ``shutdown_timeout_s`` to finish and are then aborted (each stream's last chunk says
        ``finish_reason="abort"``, then ``[DONE]``)."""
        self.draining = True
        if self.batches is not None:  # batch requests in flight stop here and run again on restart
            await self.batches.stop()
        await self.engine.shutdown(self.settings.shutdown_timeout_s)


class AccessGuard:
    """API keys and rate limits, checked before the body is read (pure ASGI, so streaming and
    client disconnects pass through untouched)."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_PROTECTED):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            client = scope.get("client") or ("?", 0)
            err = self.state.check_access(headers.get("authorization"), str(client[0]))
            if err is not None:
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


class Generation:
    """The engine requests behind one API call; ``events`` yields each choice's deltas."""

    def __init__(self, state: ServerState, choices: list[ChoiceSpec], prefix: str) -> None:
        self.state = state
        self.queue: Stream = asyncio.Queue()
        self.requests, self.choices = engine_requests(choices, prefix)
        self.texts = {
            rid: ChoiceText(state.builder.tokenizer, c.stop_strings, c.params.stop_token_ids, c.include_stop_str)
            for rid, c in self.choices.items()
        }
        self.pending: set[str] = set()

    def start(self) -> None:
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
        try:
            while self.pending:
                rid, item = await self.queue.get()
                if rid not in self.pending:
                    continue
                if isinstance(item, RequestFailed):  # forge's own words: what failed, never a library's text
                    self.pending.discard(rid)
                    raise APIError(f"generation failed: {item}", 500, "internal_error")
                if isinstance(item, BaseException):
                    self.pending.discard(rid)
                    log.error("request %s failed in the engine", rid, exc_info=item)
                    raise APIError("the engine failed while generating this request", 500, "internal_error")
                text = self.texts[rid]
                delta = text.push(item)
                if delta.finish_reason is not None:
                    self.pending.discard(rid)
                    if not item.finished:
                        self.state.engine.abort(rid, reason="stop")
                yield self.choices[rid], text, delta
        finally:
            self.close()

    async def collect(self) -> dict[int, Delta]:
        """Each choice's deltas merged into one, by choice index (the non-streaming responses)."""
        parts: dict[int, list[Delta]] = {c.index: [] for c in self.choices.values()}
        async for c, _, d in self.events():
            parts[c.index].append(d)
        return {index: Delta.merge(ds) for index, ds in parts.items()}

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens for usage: each distinct prompt once, however many choices share it."""
        return sum(len(c.prompt_ids) for c in {c.prompt_index: c for c in self.choices.values()}.values())


Endpoint = Callable[..., Any]
ChunkChoice = Callable[[ChoiceSpec, ChoiceText, Delta], dict[str, Any]]
FinalChoice = Callable[[ChoiceSpec, Delta], dict[str, Any]]


async def _json_response(
    gen: Generation,
    base: dict[str, Any],
    final_choice: FinalChoice,
    top_level: Callable[[dict[int, Delta]], dict[str, Any]] | None = None,
) -> JSONResponse:
    """The non-streaming body of one call: each choice whole (``final_choice``), the usage, and the
    fields ``top_level`` derives from the merged choices (by index)."""
    merged = await gen.collect()
    out = [final_choice(c, merged[c.index]) for c in gen.choices.values()]
    n_out = sum(len(d.token_ids) for d in merged.values())
    extra = top_level(merged) if top_level is not None else {}
    return JSONResponse({**base, "choices": out, "usage": usage(gen.prompt_tokens, n_out), **extra})


def _sse_response(
    gen: Generation,
    base: dict[str, Any],
    options: StreamOptions | None,
    chunk_choice: ChunkChoice,
    head: list[dict[str, Any]] | None = None,
) -> StreamingResponse:
    """The SSE stream of one call: the ``head`` choices, one chunk per delta, an error chunk if the
    engine fails, the usage chunk when ``stream_options.include_usage``, then ``[DONE]``. With
    ``stream_options.continuous_usage_stats`` every chunk carries the usage so far."""
    include_usage = options is not None and options.include_usage
    continuous = options is not None and options.continuous_usage_stats
    extra = {"usage": None} if include_usage else {}

    def so_far(n_out: int) -> dict[str, Any]:
        return {"usage": usage(gen.prompt_tokens, n_out)} if continuous else extra

    async def stream() -> AsyncIterator[str]:
        for choice in head or []:
            yield sse({**base, "choices": [choice], **so_far(0)})
        n_out = 0
        try:
            async for c, text, d in gen.events():
                n_out += len(d.token_ids)
                yield sse({**base, "choices": [chunk_choice(c, text, d)], **so_far(n_out)})
        except APIError as err:
            yield sse(err.body())
        if include_usage:
            yield sse({**base, "choices": [], "usage": usage(gen.prompt_tokens, n_out)})
        yield SSE_DONE

    return StreamingResponse(stream(), media_type="text/event-stream")


def _check(state: ServerState, body: SamplingFields) -> None:
    """The checks that walk the whole body (run on a worker thread: a body may hold megabytes)."""
    state.builder.check_common(body)
    check_embedded_json(body, state.settings.max_json_nesting)


async def _completions(state: ServerState, body: CompletionRequest, token_ids: bool = False) -> Response:
    """``token_ids``: each non-streamed choice also carries its generated ids (``/generate``'s ``tokens``).
    What costs CPU in proportion to the body (checks, tokenizing) runs on a worker thread."""
    b = state.builder
    await asyncio.to_thread(_check, state, body)
    if body.suffix:
        raise APIError("suffix is not supported", param="suffix")
    plan = sequence_plan(body, state.settings.max_n)
    echo_logprobs_k = body.logprobs if body.echo else None  # echo + logprobs: the prompt tokens' too
    engine_prompt_k = max((k for k in (body.prompt_logprobs, echo_logprobs_k) if k is not None), default=None)
    # best_of ranks by the sampled tokens' logprobs: the engine returns them even when not asked for
    engine_k = body.logprobs if body.logprobs is not None or not plan.picks_best else 0
    prompts = await asyncio.to_thread(b.completion_prompts, body)
    choices = await b.choices(
        body, prompts, body.max_tokens, 16, engine_k, None, engine_prompt_k, plan.num_sequences, plan.beam
    )
    check_output_budget(choices, state.settings.max_output_units, echo=body.echo)
    cid = b.next_id("cmpl")
    gen = Generation(state, choices, cid)
    gen.start()
    k = body.logprobs or 0
    tok = b.tokenizer

    def echo_text(c: ChoiceSpec) -> str:
        if not body.echo:
            return ""
        return c.prompt_text if c.prompt_text is not None else tok.decode(c.prompt_ids)

    def lp(c: ChoiceSpec, d: Delta, offset: int, first: bool) -> dict[str, Any] | None:
        """The delta's logprobs object; on a choice's first delta with echo, the prompt's before them."""
        if body.logprobs is None:
            return None
        generated = completion_logprobs(tok, d.token_ids, d.logprobs, k, offset)
        if not (body.echo and first):
            return generated
        return joined_logprobs(echo_logprobs(tok, c.prompt_ids, d.prompt_logprobs, k), generated)

    def prompt_lp(c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        if body.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(tok, c.prompt_ids, d.prompt_logprobs, body.prompt_logprobs)}

    base = {"id": cid, "object": "text_completion", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        started: set[int] = set()

        def chunk(c: ChoiceSpec, text: ChoiceText, d: Delta) -> dict[str, Any]:
            first = c.index not in started
            prefix = echo_text(c) if first else ""
            started.add(c.index)
            # offsets count the echoed prompt too, as the whole response's do
            logprobs = lp(c, d, text.sent - len(d.text) + len(echo_text(c)), first)
            head = prompt_lp(c, d) if first else {}
            return {
                "index": c.index,
                "text": prefix + d.text,
                "logprobs": logprobs,
                "finish_reason": d.finish_reason,
                **head,
            }

        return _sse_response(gen, base, body.stream_options, chunk)

    def whole(c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        echo = echo_text(c)
        logprobs = lp(c, d, len(echo), True)
        return {
            "index": c.index,
            "text": echo + d.text,
            "logprobs": logprobs,
            "finish_reason": d.finish_reason,
            "stop_reason": None,
            **prompt_lp(c, d),
            **({"token_ids": list(d.token_ids)} if token_ids else {}),
        }

    if plan.picks_best:  # the n best of best_of; the usage counts every sequence sampled (OpenAI's)
        merged = await gen.collect()
        picked = [{**whole(c, merged[c.index]), "index": i} for i, c in best_choices(choices, merged, plan.n)]
        n_out = sum(len(d.token_ids) for d in merged.values())
        return JSONResponse({**base, "choices": picked, "usage": usage(gen.prompt_tokens, n_out)})
    return await _json_response(gen, base, whole)


def _chat_prompt(state: ServerState, body: ChatCompletionRequest) -> tuple[ToolPlan | None, tuple[list[int], str]]:
    """The tool plan (the tools' schemas checked) and the rendered prompt (on a worker thread)."""
    plan = tool_plan(body, state.settings.tool_call_parser)
    return plan, state.builder.chat_prompt(body, plan.tools if plan is not None else None)


async def _chat(state: ServerState, body: ChatCompletionRequest) -> Response:
    """As ``_completions``: the checks, the tool schemas' checks and the template render run on a worker thread."""
    b = state.builder
    await asyncio.to_thread(_check, state, body)
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    if body.prompt_logprobs is not None and body.stream:
        raise APIError("prompt_logprobs is returned by non-streaming chat completions only", param="prompt_logprobs")
    plan, prompt = await asyncio.to_thread(_chat_prompt, state, body)
    engine_logprobs = (body.top_logprobs or 0) if body.logprobs else None
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    spec = plan.spec if plan is not None else None
    choices = await b.choices(body, [prompt], max_tokens, None, engine_logprobs, spec, body.prompt_logprobs)
    check_output_budget(choices, state.settings.max_output_units)
    cid = b.next_id("chatcmpl")
    gen = Generation(state, choices, cid)
    gen.start()
    tok = b.tokenizer
    k = body.top_logprobs or 0
    last = body.messages[-1]
    echo = last.text() if body.echo and last.role == "assistant" else ""

    def lp(d: Delta) -> dict[str, Any] | None:
        return chat_logprobs(tok, d.token_ids, d.logprobs, k) if body.logprobs else None

    base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        tool_streams = {c.index: ToolStream(plan) for c in choices} if plan is not None else {}

        def chunk(c: ChoiceSpec, _: ChoiceText, d: Delta) -> dict[str, Any]:
            ts = tool_streams.get(c.index)
            reason = d.finish_reason
            # "" while text is held back (vLLM's shape, not an empty delta)
            delta: dict[str, Any] = {"content": d.text if ts is None else ts.push(d.text)}
            if ts is not None and reason is not None:
                rest, calls = ts.finish()
                delta["content"] += rest
                if calls:
                    delta["tool_calls"] = [call.body(i) for i, call in enumerate(calls)]
                    reason = "tool_calls"
            return {"index": c.index, "delta": delta, "logprobs": lp(d), "finish_reason": reason}

        role = {"role": "assistant", "content": echo}
        head = [{"index": c.index, "delta": role, "logprobs": None, "finish_reason": None} for c in choices]
        return _sse_response(gen, base, body.stream_options, chunk, head)

    def whole(c: ChoiceSpec, d: Delta) -> dict[str, Any]:
        content, calls = plan.parse(d.text) if plan is not None else (d.text, [])
        message: dict[str, Any] = {"role": "assistant", "content": echo + content}
        reason = d.finish_reason
        if calls:
            message["content"] = (echo + content) or None
            message["tool_calls"] = [call.body() for call in calls]
            reason = "tool_calls"
        return {"index": c.index, "message": message, "logprobs": lp(d), "finish_reason": reason}

    def prompt_lp(merged: dict[int, Delta]) -> dict[str, Any]:
        """vLLM's chat shape: the prompt's logprobs once, on the response (every choice shares the prompt)."""
        if body.prompt_logprobs is None:
            return {}
        c = choices[0]
        entries = merged[c.index].prompt_logprobs
        return {"prompt_logprobs": vllm_prompt_logprobs(tok, c.prompt_ids, entries, body.prompt_logprobs)}

    return await _json_response(gen, {**base, "object": "chat.completion"}, whole, prompt_lp)


def build_app(
    engine: Engine,
    settings: ServerSettings,
    structured: StructuredBackend | None = None,
    model_name: str = "forge",
    pooling: PoolingParams | None = None,
) -> FastAPI:
    """The app over an engine it takes ownership of (started and stopped by the app's lifespan).
    ``pooling``: how ``/v1/embeddings`` pools (None: mean, L2-normalised)."""
    name = settings.served_model_name or model_name
    metrics = ServerMetrics(name)
    metrics.ensure_labels()
    sched = engine.scheduler
    limits = EngineLimits(
        max_model_len=sched.limits.max_model_len,
        kv_capacity_tokens=sched.kv.token_capacity(sched.limits.max_num_batched_tokens),
        vocab_size=engine.tokenizer.vocab_size,
    )
    compiler = CompilePool(structured) if structured is not None else None
    builder = RequestBuilder(
        engine.tokenizer, limits, compiler, name, settings.max_n, settings.max_logprobs, settings.max_stop_len
    )
    state = ServerState(
        engine=AsyncEngine(engine, metrics, settings.max_waiting),
        builder=builder,
        settings=settings,
        metrics=metrics,
        limiter=RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst),
        model_name=name,
        max_model_len=limits.max_model_len,
    )
    embedder = embedding_service(state, engine, limits, pooling or PoolingParams())
    batch_ids = itertools.count()
    state.handlers.update(
        {
            "/v1/completions": json_handler(CompletionRequest, lambda body: _completions(state, body)),
            "/v1/chat/completions": json_handler(ChatCompletionRequest, lambda body: _chat(state, body)),
            "/v1/embeddings": json_handler(
                EmbeddingRequest, lambda body: create_embeddings(embedder, body, f"embd-batch-{next(batch_ids)}")
            ),
        }
    )
    files = FileStore(settings.state_path() / "files")
    runner = state.batches = BatchRunner(
        BatchStore(settings.state_path() / "batches"),
        files,
        state.handlers,
        name,
        settings.batch_max_in_flight,
        settings.batch_priority,
    )
    control = ShutdownControl(state.drain, settings.admin_keys)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        if compiler is not None:
            compiler.start()
        runner.start()
        yield
        await runner.stop()
        await state.engine.shutdown(settings.shutdown_timeout_s)
        if compiler is not None:
            compiler.close()
        if state.engine.leak:
            log.error("engine shut down with a leak: %s", state.engine.leak)

    app = FastAPI(title="forge", lifespan=lifespan, responses=ERROR_RESPONSES)
    app.router.route_class = OffLoopBodyRoute  # bodies parsed and validated on a worker thread
    app.state.forge = state
    app.state.shutdown = control
    # AccessGuard is outermost: an unauthenticated or rate-limited request's body is never read.
    app.add_middleware(
        BodyLimits,
        max_bytes=settings.max_body_bytes,
        timeout_s=settings.body_timeout_s,
        max_nesting=settings.max_json_nesting,
    )
    app.add_middleware(AccessGuard, state=state)
    install_error_handlers(app)
    app.include_router(embeddings_router(embedder))

    def get(path: str, response_class: type[Response] = JSONResponse) -> Callable[[Endpoint], Endpoint]:
        """A GET route that also answers HEAD (the schema lists the GET only, and a 405's
        ``Allow`` names it)."""

        def register(endpoint: Endpoint) -> Endpoint:
            app.get(path, response_class=response_class)(endpoint)
            app.head(path, response_class=response_class, include_in_schema=False)(endpoint)
            return endpoint

        return register

    @get("/health", response_class=Response)
    async def health() -> Response:
        """200 with an empty body while the server takes requests; 503 once draining or failed."""
        ok = state.engine.healthy and not state.draining
        return Response(status_code=200 if ok else 503)

    @get("/metrics", response_class=PlainTextResponse)
    async def prometheus() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": name,
            "object": "model",
            "created": state.created,
            "owned_by": "forge",
            "root": name,
            "max_model_len": limits.max_model_len,
            "vocab_size": limits.vocab_size,
            "eos_token_ids": sorted(engine.tokenizer.eos_token_ids),
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await unless_disconnected(request, _completions(state, body))

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await unless_disconnected(request, _chat(state, body))

    app.include_router(tokenize_router(builder, limits, name, settings.max_json_nesting))
    owners = Owners(settings, settings.state_path() / "owner.secret")
    app.include_router(files_router(files, owners, runner.input_in_use))
    app.include_router(batches_router(runner, owners))
    app.include_router(generate_router(lambda body: _completions(state, body, token_ids=True), name))
    app.include_router(admin_router(control, settings.shutdown_timeout_s))
    app.include_router(version_router())
    return app


def model_choice_name(cfg: DictConfig) -> str:
    """The model option's name (``model=tiny`` -> ``tiny``) when Hydra knows it."""
    try:
        from hydra.core.hydra_config import HydraConfig

        choice = HydraConfig.get().runtime.choices.get("model")
        if choice:
            return str(choice)
    except (ValueError, AttributeError):
        pass
    target = str(cfg.model.get("_target_", "forge"))
    return target.rsplit(".", 1)[-1]


def app_from_config(cfg: DictConfig, model_name: str | None = None) -> tuple[FastAPI, ServerSettings]:
    from forge.config import validate
    from forge.engine.build import build_engine, default_pooling

    validate(cfg)
    settings: ServerSettings = instantiate(cfg.server) if cfg.get("server") is not None else ServerSettings()
    engine = build_engine(cfg)
    if engine.clock.simulated:
        raise APIError("served mode needs clock=wall")
    structured = None
    if cfg.get("structured") is not None:
        structured = instantiate(cfg.structured)(tokenizer=engine.tokenizer)
    app = build_app(engine, settings, structured, model_name or model_choice_name(cfg), default_pooling(cfg))
    return app, settings


def hydra_run_dir() -> Path | None:
    """The run directory Hydra made for this job, if a Hydra job is running."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except (ValueError, AttributeError):
        return None


def serve(cfg: DictConfig) -> None:
    """Serve until SIGINT/SIGTERM or ``POST /shutdown``, then drain (``ForgeServer``) and write
    the final Prometheus metrics to the run directory's ``server_metrics.prom``."""
    app, settings = app_from_config(cfg)
    state: ServerState = app.state.forge
    server = ForgeServer(uvicorn_config(app, settings), state.drain)
    app.state.shutdown.exit_server = server.request_exit
    server.run()
    run_dir = hydra_run_dir()
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "server_metrics.prom").write_bytes(state.metrics.render())
        log.info("wrote %s", run_dir / "server_metrics.prom")
