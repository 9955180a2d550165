"""Assemble an Engine from a composed config. Hydra's ``instantiate`` is the only factory."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from omegaconf import DictConfig, OmegaConf

from forge.config import DEFAULT_KV_CACHE_MEMORY_GIB, ConfigError, check_one_engine, max_model_len_for
from forge.core.fast_paths import declares_fast_paths
from forge.core.kv_groups import KVCacheGroups, group_layers
from forge.core.pooling import PoolingParams
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.engine import Engine
from forge.engine.gc_pause import paused_gc
from forge.engine.make import make
from forge.engine.runner_base import Runner
from forge.engine.sim_runner import HostModel, SimulationRunner
from forge.kernels.base import KernelBackend, KVSpec
from forge.kernels.kv_quant import is_quantized_name, kv_cache_dtype
from forge.kvcache.base import KVCacheManager
from forge.kvcache.context import CONTEXT_KEYS, KVCacheContext
from forge.models.base import Model, ModelDims
from forge.policies.base import Policy
from forge.sched.scheduler import Scheduler, SchedulerLimits
from forge.sim.clock import Clock, SimulatedClock
from forge.spec.base import Drafter
from forge.workloads.synthetic import RequestSpec, Workload

log = logging.getLogger("forge.engine.build")


def auto_num_blocks(
    cfg: DictConfig,
    spec: KVSpec,
    block_size: int,
    clock: Clock,
    max_model_len: int,
    model: Model,
    groups: KVCacheGroups | None = None,
) -> int:
    """Blocks that fit the KV memory budget, ``engine.kv_cache_memory_gib`` when set, else the
    simulated hardware's memory left after the simulated weights (``clock=simulated``) or
    ``DEFAULT_KV_CACHE_MEMORY_GIB``, in bytes per token of the simulated model under
    ``clock=simulated``, else of the real KV layout; never more than every sequence at full
    length needs. With hybrid KV cache ``groups``: pages of that layout (the same memory), never
    more than every sequence holds with its windows freed."""
    gib = cfg.engine.kv_cache_memory_gib
    if isinstance(clock, SimulatedClock):
        dims = clock.model_dims
        per_token = dims.kv_bytes_per_token
        budget = 0.9 * clock.hw.memory - dims.num_params * dims.bytes_per_param if gib is None else gib * 2**30
    else:
        per_token = spec.bytes_per_token()
        budget = (DEFAULT_KV_CACHE_MEMORY_GIB if gib is None else gib) * 2**30
    by_memory = int(budget // (per_token * block_size))
    by_demand = cfg.engine.max_num_seqs * -(-max_model_len // block_size)
    if groups is not None:
        by_memory = groups.pages_for(by_memory)
        chunk = cfg.engine.max_num_batched_tokens
        by_demand = cfg.engine.max_num_seqs * groups.pages_held(max_model_len, block_size, chunk)
    n = min(by_memory, by_demand)
    if n < 1:
        raise ConfigError("no memory left for the KV cache: lower the model size or set kvcache.num_blocks")
    return n


def kv_spec_for(cfg: DictConfig, model: Model) -> KVSpec:
    """The model's KV layout, in ``engine.kv_cache_dtype`` unless that is ``auto``. A model whose
    cache holds no K/V (``model=synthetic``: token ids) keeps it; int8/fp8 then quantize only the
    transformer it simulates (``simulated_dims``)."""
    name = cfg.engine.get("kv_cache_dtype", "auto")
    if name == "auto":
        return model.kv_spec
    if not model.kv_spec.is_floating_point:
        if is_quantized_name(name):
            return model.kv_spec
        raise ConfigError(f"engine.kv_cache_dtype={name}: this model's cache holds {model.kv_spec.dtype}, keep auto")
    return dataclasses.replace(model.kv_spec, dtype=kv_cache_dtype(name))


def simulated_dims(cfg: DictConfig, model: Model) -> ModelDims:
    """The dims the clock charges: the model's, with KV values in one byte plus their scale's share
    when ``engine.kv_cache_dtype`` is int8/fp8 (the float dtypes keep ``bytes_per_param``)."""
    name = cfg.engine.get("kv_cache_dtype", "auto")
    quantized = name != "auto" and is_quantized_name(name)
    return dataclasses.replace(model.dims, kv_quantized=quantized) if quantized else model.dims


def kv_context(cfg: DictConfig, model: Model, kv_spec: KVSpec, clock: Clock, max_model_len: int) -> KVCacheContext:
    """What the KV cache is built from: the pool ``kvcache.block_size`` / ``num_blocks`` describe (sized
    for ``kv_spec`` when ``auto``), the model's layers grouped by window and the engine's limits."""
    block_size = cfg.kvcache.get("block_size", 16)
    if not isinstance(block_size, int) or block_size < 1:
        raise ConfigError(f"kvcache.block_size must be an integer >= 1, got {block_size!r}")
    groups = group_layers(model.layer_windows())
    num_blocks = cfg.kvcache.get("num_blocks", "auto")
    num_pages = None  # (kvcache.num_blocks counts blocks of every layer: as many pages of that memory)
    if num_blocks == "auto":
        num_blocks = auto_num_blocks(cfg, kv_spec, block_size, clock, max_model_len, model)
        if groups.is_hybrid:
            num_pages = auto_num_blocks(cfg, kv_spec, block_size, clock, max_model_len, model, groups)
    return KVCacheContext(
        num_blocks=num_blocks,
        block_size=block_size,
        groups=groups,
        num_pages=num_pages,
        max_model_len=max_model_len,
        preemption_mode=cfg.engine.preemption_mode,
        dtype=str(kv_spec.dtype).removeprefix("torch."),
    )


def build_kvcache(cfg: DictConfig, ctx: KVCacheContext) -> KVCacheManager:
    """The KV manager ``cfg.kvcache`` names: its ``_target_`` called with ``ctx`` and the YAML's own
    settings (every key but ``CONTEXT_KEYS``, which ``ctx`` holds)."""
    kv_cfg: dict[str, Any] = OmegaConf.to_container(cfg.kvcache, resolve=True)  # type: ignore[assignment]
    settings = {k: v for k, v in kv_cfg.items() if k not in CONTEXT_KEYS}
    # (Hydra would turn a dataclass argument into a DictConfig: the context goes to the partial)
    factory = make("kvcache", settings, _partial_=True)
    try:
        kv: KVCacheManager = factory(ctx)
    except ValueError as err:
        raise ConfigError(f"kvcache: {err}") from err
    return kv


def build_engine(cfg: DictConfig, model: Model | None = None) -> Engine:
    """The engine ``cfg`` describes. ``model``: an already loaded model to reuse instead of
    ``cfg.model`` (it must live on the backend's device); models hold no per-request state. A config
    asking for several replicas is a ``ConfigError`` (``forge.cluster`` builds each replica)."""
    check_one_engine(cfg)
    backend: KernelBackend = make("backend", cfg.backend)
    default_pooling(cfg)  # a bad embedding setting fails before the model loads
    if cfg.engine.tensor_parallel_size > 1:
        from forge.engine.tensor_parallel import torchrun_env, worker_main

        env = torchrun_env()
        if env is not None and env[0] > 0:  # torchrun started this process as another rank: serve rank 0
            worker_main(OmegaConf.to_container(cfg, resolve=True), *env)  # type: ignore[arg-type]
            raise SystemExit(0)
    if model is None:
        model = make("model", cfg.model, device=backend.device_name)
    max_model_len = max_model_len_for(cfg, model.max_position)
    clock: Clock = make("clock", cfg.clock)
    dims = simulated_dims(cfg, model)
    clock.bind(dims)
    kv_spec = kv_spec_for(cfg, model)
    kv = build_kvcache(cfg, kv_context(cfg, model, kv_spec, clock, max_model_len))
    policy: Policy = make("scheduler", cfg.scheduler)
    limits = SchedulerLimits(
        max_num_seqs=cfg.engine.max_num_seqs,
        max_num_batched_tokens=cfg.engine.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_chunked_prefill=cfg.engine.enable_chunked_prefill,
        preemption_mode=cfg.engine.preemption_mode,
    )
    check_whole_prompts(policy, limits)
    fast_paths = cfg.engine.fast_paths
    runner = build_runner(cfg, model, backend, kv, limits, kv_spec)
    drafter = build_drafter(cfg, backend, model)
    scheduler = Scheduler(policy, kv, limits, fast_paths=fast_paths)
    engine = Engine(scheduler, runner, clock, drafter=drafter, dims=dims, fast_paths=fast_paths)
    if fast_paths and clock.simulated and (plain := engine.plain_components()):
        log.info(
            "fast paths off for %s: a class that does not declare fast_paths = True runs the plain "
            "step loop (forge/core/fast_paths.py)",
            ", ".join(plain),
        )
    return engine


def check_whole_prompts(policy: Policy, limits: SchedulerLimits) -> None:
    """ConfigError when, without chunked prefill, a step's token budget (the engine's, or a declaring
    policy's ``token_budget`` of it: pure, ``forge.core.fast_paths``) is below ``max_model_len``: a
    longer prompt could never be scheduled, and the run would wait on it forever."""
    engine_budget, max_model_len = limits.max_num_batched_tokens, limits.max_model_len
    if limits.enable_chunked_prefill:
        return
    if engine_budget < max_model_len:
        raise ConfigError(
            f"engine.max_num_batched_tokens={engine_budget} < max_model_len={max_model_len} "
            "needs engine.enable_chunked_prefill=true"
        )
    budget = policy.token_budget(engine_budget) if declares_fast_paths(policy) else engine_budget
    if budget < max_model_len:
        raise ConfigError(
            f"scheduler {type(policy).__name__}'s token budget of {budget} (of engine.max_num_batched_tokens="
            f"{engine_budget}) < max_model_len={max_model_len} needs engine.enable_chunked_prefill=true"
        )


def build_runner(
    cfg: DictConfig, model: Model, backend: KernelBackend, kv: KVCacheManager, limits: SchedulerLimits, spec: KVSpec
) -> Runner:
    """The runner for ``model`` over ``kv``'s pool: tensor-parallel ranks (``engine.tensor_parallel_size`` > 1);
    the ``runner`` config group's when one is chosen (``runner=<name>``: its ``_target_`` called with its
    YAML's fields and the keywords of ``Runner``'s docstring); a ``SimulationRunner`` for a model that
    computes on the host with its cache on the host (no batch tensors, no torch; its host path is a fast
    path, ``engine.fast_paths``); else a ``ModelRunner``."""
    if cfg.engine.tensor_parallel_size > 1:
        from forge.engine.tensor_parallel import TensorParallelRunner, WorkerSetup

        setup = WorkerSetup(
            kv.num_blocks,
            kv.block_size,
            kv.num_cpu_blocks,
            limits.max_num_seqs,
            limits.max_model_len,
            spec.torch_dtype(),
            cfg.seed,
            kv.kv_groups,
        )
        return TensorParallelRunner(model, backend, cfg, setup)
    sizes: dict[str, Any] = {
        "num_blocks": kv.num_blocks,
        "block_size": kv.block_size,
        "seed": cfg.seed,
        "num_cpu_blocks": kv.num_cpu_blocks,
        "max_num_seqs": limits.max_num_seqs,
        "max_model_len": limits.max_model_len,
        "kv_spec": spec,
        "kv_groups": kv.kv_groups,
    }
    if cfg.get("runner") is not None:  # the runner config group: a runner of the user's (``Runner``)
        runner: Runner = make("runner", cfg.runner, _partial_=True)(model=model, backend=backend, **sizes)
        return runner
    if not (isinstance(model, HostModel) and backend.device_type == "cpu"):
        from forge.engine.runner import ModelRunner

        return ModelRunner(model, backend, **sizes)
    return SimulationRunner(model, backend, **sizes, fast_paths=cfg.engine.fast_paths)


def build_drafter(cfg: DictConfig, backend: KernelBackend, target: Model) -> Drafter | None:
    """``cfg.drafter`` (None: no speculation). A drafter with a ``model`` node gets that model,
    built on the target's backend, and must share the target's vocabulary."""
    node = cfg.get("drafter")
    if node is None:
        return None
    if "model" not in node:
        drafter: Drafter = make("drafter", node)
        return drafter
    draft_model: Model = make("drafter.model", node.model, device=backend.device_name)
    if draft_model.vocab_size != target.vocab_size:
        raise ConfigError(
            f"drafter.model has a vocabulary of {draft_model.vocab_size} tokens, the target {target.vocab_size}"
        )
    drafter = make("drafter", node, model=draft_model, backend=backend)
    return drafter


def default_sampling(cfg: DictConfig) -> SamplingParams:
    params: SamplingParams = make("sampling", cfg.sampling)
    return params


def default_pooling(cfg: DictConfig) -> PoolingParams:
    """How embedding requests pool (the ``embedding`` group; mean, L2-normalised without one)."""
    node = cfg.get("embedding")
    params: PoolingParams = make("embedding", node) if node is not None else PoolingParams()
    return params


def workload_requests(cfg: DictConfig, engine: Engine) -> list[Request]:
    """The workload's requests with the configured sampling; output lengths set ``max_tokens``."""
    workload: Workload = make("workload", cfg.workload)
    base = OmegaConf.to_container(cfg.sampling, resolve=True)
    assert isinstance(base, dict)
    kwargs: dict[str, Any] = {str(k): v for k, v in base.items() if not str(k).startswith("_")}
    kwargs["ignore_eos"] = workload.ignore_eos or bool(kwargs.get("ignore_eos", False))
    if kwargs.get("stop"):  # honoured or refused, never ignored: workload runs never decode text
        raise ConfigError(
            "sampling.stop: stop strings are matched on decoded text, which a workload run does not produce; "
            "use sampling.stop_token_ids (or stop strings through the server or LLM)"
        )
    if "max_tokens" in kwargs:  # refused, not ignored: each request's max_tokens is its drawn output length
        raise ConfigError(
            "sampling.max_tokens: a workload's output lengths are its requests' max_tokens; set workload.output_len"
        )
    max_prompt_len = engine.scheduler.limits.max_model_len - 1  # one token at least is generated
    with paused_gc():  # thousands of prompts: no GC passes over them while they are built
        try:
            specs = workload.requests(engine.tokenizer, max_prompt_len)
        except ValueError as e:  # the workload is config: a bad trace row, a prompt that can never run
            raise ConfigError(f"workload: {e}") from e
        return as_requests(specs, kwargs)


def as_requests(specs: list[RequestSpec], kwargs: dict[str, Any]) -> list[Request]:
    """``specs`` as requests sampling with ``kwargs``, their output lengths as ``max_tokens``;
    requests of one output length share their (immutable) sampling parameters."""
    params = {n: SamplingParams(**{**kwargs, "max_tokens": n}) for n in dict.fromkeys(s.output_len for s in specs)}
    # positional, in Request's field order (id, prompt, sampling, arrival, priority, expected output
    # length): keywords cost half as much again for a million requests
    return [
        Request(
            spec.request_id,
            spec.prompt_token_ids,
            params[spec.output_len],
            spec.arrival_time,
            spec.priority,
            spec.output_len,
        )
        for spec in specs
    ]
