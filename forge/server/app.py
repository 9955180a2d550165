"""The OpenAI-compatible HTTP front end: ``python run.py mode=serve``.

``build_app`` puts the app together from routers, one per module: ``completions`` (POST
/v1/completions), ``chat`` (POST /v1/chat/completions; both SSE when ``stream``), ``embeddings``
(POST /v1/embeddings), ``service_routes`` (GET /v1/models, /health, /metrics), ``tokenize`` (POST
/tokenize, /detokenize), ``files`` and ``batch_routes`` (/v1/files, /v1/batches), ``generate`` (POST
/generate), ``admin`` (POST /shutdown), ``version`` (GET /version). Every request is validated by
``RequestBuilder`` before anything reaches the engine (4xx in OpenAI's error shape); the engine runs
on its own thread (``AsyncEngine``). docs/server-internals.md walks through a request."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from hydra.utils import instantiate
from omegaconf import DictConfig

from forge.core.pooling import PoolingParams
from forge.engine.engine import Engine
from forge.engine.gc_pause import default_gc
from forge.server.admin import ShutdownControl, admin_router
from forge.server.async_engine import AsyncEngine
from forge.server.auth import RateLimiter
from forge.server.batch_lines import Handler, json_handler
from forge.server.batch_routes import batches_router
from forge.server.batch_store import BatchStore
from forge.server.batches import BatchRunner
from forge.server.bodies import OffLoopBodyRoute
from forge.server.builder import RequestBuilder
from forge.server.chat import chat_router, create_chat
from forge.server.completions import completions_router, create_completion
from forge.server.embeddings import EmbeddingService, create_embeddings, embedding_service, embeddings_router
from forge.server.errors import ERROR_RESPONSES, install_error_handlers
from forge.server.files import FileStore, files_router
from forge.server.generate import generate_router
from forge.server.launch import ForgeServer, uvicorn_config
from forge.server.limits import BodyLimits
from forge.server.metrics import ServerMetrics
from forge.server.owners import Owners
from forge.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from forge.server.request_limits import EngineLimits
from forge.server.service_routes import service_router
from forge.server.settings import ServerSettings
from forge.server.state import AccessGuard, ServerState
from forge.server.tokenize import tokenize_router
from forge.server.version import version_router
from forge.structured.base import StructuredBackend
from forge.structured.compile_pool import CompilePool
from forge.tokenizers.none import has_text

log = logging.getLogger("forge.server")
Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def engine_limits(engine: Engine) -> EngineLimits:
    """What the front end checks requests against, read from the engine once."""
    sched = engine.scheduler
    return EngineLimits(
        max_model_len=sched.limits.max_model_len,
        kv_capacity_tokens=sched.kv.token_capacity(sched.limits.max_num_batched_tokens),
        vocab_size=engine.tokenizer.vocab_size,
    )


def server_state(
    engine: Engine, settings: ServerSettings, compiler: CompilePool | None, name: str, limits: EngineLimits
) -> ServerState:
    metrics = ServerMetrics(name)
    metrics.ensure_labels(engine.scheduler.kv.block_size, engine.scheduler.kv.num_blocks)
    builder = RequestBuilder(
        engine.tokenizer,
        limits,
        compiler,
        name,
        settings.max_n,
        settings.max_logprobs,
        settings.max_stop_len,
        settings.chat_template_text(),
    )
    return ServerState(
        engine=AsyncEngine(engine, metrics, settings.max_waiting),
        builder=builder,
        settings=settings,
        metrics=metrics,
        limiter=RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst),
        model_name=name,
        max_model_len=limits.max_model_len,
    )


def batch_handlers(state: ServerState, embedder: EmbeddingService) -> dict[str, Handler]:
    """What a batch line may call, by endpoint path: the routes' own functions, without HTTP."""
    batch_ids = itertools.count()
    return {
        "/v1/completions": json_handler(CompletionRequest, lambda body: create_completion(state, body)),
        "/v1/chat/completions": json_handler(ChatCompletionRequest, lambda body: create_chat(state, body)),
        "/v1/embeddings": json_handler(
            EmbeddingRequest, lambda body: create_embeddings(embedder, body, f"embd-batch-{next(batch_ids)}")
        ),
    }


def lifespan(state: ServerState, compiler: CompilePool | None, runner: BatchRunner) -> Lifespan:
    """Starts the engine, the grammar compile pool and the batch runner; stops them in reverse."""

    @asynccontextmanager
    async def run(_: FastAPI) -> AsyncIterator[None]:
        state.engine.start()
        if compiler is not None:
            compiler.start()
        runner.start()
        yield
        await runner.stop()
        await state.engine.shutdown(state.settings.shutdown_timeout_s)
        if compiler is not None:
            compiler.close()
        if state.engine.leak:
            log.error("engine shut down with a leak: %s", state.engine.leak)

    return run


def _guard(app: FastAPI, state: ServerState) -> None:
    """The body limits, and outside them AccessGuard: an unauthenticated or rate-limited request's
    body is never read."""
    s = state.settings
    app.add_middleware(
        BodyLimits, max_bytes=s.max_body_bytes, timeout_s=s.body_timeout_s, max_nesting=s.max_json_nesting
    )
    app.add_middleware(AccessGuard, state=state)
    install_error_handlers(app)


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
    limits = engine_limits(engine)
    compiler = CompilePool(structured) if structured is not None else None
    state = server_state(engine, settings, compiler, name, limits)
    embedder = embedding_service(state, engine, limits, pooling or PoolingParams())
    state.handlers.update(batch_handlers(state, embedder))
    files = FileStore(settings.state_path() / "files")
    batch_store = BatchStore(settings.state_path() / "batches")
    runner = state.batches = BatchRunner(
        batch_store,
        files,
        state.handlers,
        name,
        settings.batch_max_in_flight,
        settings.batch_priority,
        settings.batch_window_s,
    )
    control = ShutdownControl(state.drain, settings.admin_keys)
    app = FastAPI(title="forge", lifespan=lifespan(state, compiler, runner), responses=ERROR_RESPONSES)
    app.router.route_class = OffLoopBodyRoute  # bodies parsed and validated on a worker thread
    app.state.forge = state
    app.state.shutdown = control
    _guard(app, state)
    owners = Owners(settings, settings.state_path() / "owner.secret")
    for router in (
        embeddings_router(embedder),
        service_router(state, limits.vocab_size, sorted(engine.tokenizer.eos_token_ids)),
        completions_router(state),
        chat_router(state),
        tokenize_router(state.builder, limits, name, settings.max_json_nesting),
        files_router(files, owners, runner.input_in_use),
        batches_router(runner, owners),
        generate_router(lambda body: create_completion(state, body, token_ids=True), name),
        admin_router(control, settings.shutdown_timeout_s),
        version_router(),
    ):
        app.include_router(router)
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
    if cfg.get("structured") is not None and has_text(engine.tokenizer):  # none: no vocabulary to constrain
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
    with default_gc():  # whatever thresholds the start-up ran with (forge serve: rare_gc)
        server.run()
    run_dir = hydra_run_dir()
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "server_metrics.prom").write_bytes(state.metrics.render())
        log.info("wrote %s", run_dir / "server_metrics.prom")
