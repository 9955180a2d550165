"""Validation of a composed config (``validate``, ``validate_settings``): the keys of the top level and
of ``engine`` against the schema (``+engine.foo=1`` adds a key struct mode cannot refuse), each option's
keys and scalar types against its target's signature, the model's dtype and path, the KV pool's sizes,
the engine's numbers, the clock's model preset and the cheap components built once to check their
arguments: everything the config alone decides, before anything is built or loaded. And
``check_one_engine``, what ``build_engine`` refuses of a config asking for several replicas."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from forge.config_schema import GROUPS, KV_CACHE_DTYPES, MODEL_DTYPES, ConfigError, EngineConfig, ForgeConfig
from forge.core.config_types import type_problem
from forge.kvcache.context import CONTEXT_KEYS
from forge.models.timing_only import timing_only_problem


def check_node(path: str, node: Any) -> None:
    """The keys of option ``node`` (at ``path``) against its ``_target_``'s signature, and their
    scalar values against its type hints; nested options likewise."""
    if not isinstance(node, DictConfig) or "_target_" not in node:
        return
    target = get_object(node._target_)
    fn = target.__init__ if inspect.isclass(target) else target
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        hints = {}
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    for key in node:
        key = str(key)
        if key.startswith("_") or (path == "kvcache" and key in CONTEXT_KEYS):
            continue  # (a KV cache's pool sizes reach it in its KVCacheContext: _check_kvcache_sizes)
        if key not in sig.parameters and not accepts_any:
            known = [p for p in sig.parameters if p != "self"]
            raise ConfigError(f"{path}.{key}: not a setting of {node._target_} (it takes {known})")
        value = node._get_node(key)
        if isinstance(value, DictConfig):
            check_node(f"{path}.{key}", value)
            continue
        if OmegaConf.is_missing(node, key):
            raise ConfigError(f"{path}.{key} must be set (e.g. {path}.{key}=...)")
        raw = node[key]
        if raw == "auto":
            continue  # sized by the engine at build time
        written = OmegaConf.to_container(raw, resolve=False) if OmegaConf.is_config(raw) else raw  # lists: as written
        problem = type_problem(hints.get(key), written)
        if problem is not None:
            raise ConfigError(f"{path}.{key}={raw!r}: {problem}")


def _check_schema_keys(cfg: DictConfig) -> None:
    """Keys of the top level and of ``engine`` must be fields of the schema: Hydra's ``+key=value``
    adds a key even to a struct config, so the composed config is checked again here."""
    for prefix, node, schema in (("", cfg, ForgeConfig), ("engine.", cfg.engine, EngineConfig)):
        known = [f.name for f in dataclasses.fields(schema)]
        for key in map(str, node):
            if key not in known and not (prefix == "" and key == "hydra"):
                raise ConfigError(f"{prefix}{key}: not a setting (the settings here are {known})")


def _check_model_dtypes(cfg: DictConfig) -> None:
    drafter = cfg.get("drafter")
    nodes = {"model": cfg.get("model"), "drafter.model": drafter.get("model") if drafter is not None else None}
    for path, node in nodes.items():
        if isinstance(node, DictConfig) and "dtype" in node and node.dtype not in MODEL_DTYPES:
            raise ConfigError(f"{path}.dtype={node.dtype!r}: not a model dtype (valid: {', '.join(MODEL_DTYPES)})")


def _check_kvcache_sizes(cfg: DictConfig) -> None:
    """The pool's sizes, which the engine would otherwise only check after loading the model."""
    kv = cfg.get("kvcache")
    if not isinstance(kv, DictConfig):
        return
    block_size = kv.get("block_size")
    if block_size is not None and (not isinstance(block_size, int) or block_size < 1):
        raise ConfigError(f"kvcache.block_size must be an integer >= 1, got {block_size!r}")
    num_blocks = kv.get("num_blocks")
    if num_blocks is not None and num_blocks != "auto" and (not isinstance(num_blocks, int) or num_blocks < 1):
        raise ConfigError(f"kvcache.num_blocks must be >= 1, got {num_blocks!r} (or auto: sized from memory)")
    cpu_blocks = kv.get("num_cpu_blocks")
    if cpu_blocks is not None and (not isinstance(cpu_blocks, int) or cpu_blocks < 0):
        raise ConfigError(f"kvcache.num_cpu_blocks must be null or an integer >= 0, got {cpu_blocks!r}")


def _check_backend_kv_dtype(cfg: DictConfig) -> None:
    """``engine.kv_cache_dtype`` must be one the backend stores (its class's ``kv_cache_dtypes``)."""
    name = cfg.engine.kv_cache_dtype
    backend = cfg.get("backend")
    if name == "auto" or not isinstance(backend, DictConfig) or "_target_" not in backend:
        return
    supported = getattr(get_object(backend._target_), "kv_cache_dtypes", None)
    if supported is not None and name not in supported:
        raise ConfigError(
            f"engine.kv_cache_dtype={name}: backend {backend._target_} cannot store it "
            f"(it takes auto, {', '.join(sorted(supported))})"
        )


def _check_clock_presets(cfg: DictConfig) -> None:
    """``clock.model`` names a dims preset; an unknown one would only fail once the model is loaded."""
    clock = cfg.get("clock")
    preset = clock.get("model", "auto") if isinstance(clock, DictConfig) else "auto"
    if preset in (None, "auto"):
        _check_simulated_clock(clock)
        return
    from forge.models.presets import MODEL_PRESETS

    if preset not in MODEL_PRESETS:
        valid = ", ".join(["auto", *sorted(MODEL_PRESETS)])
        raise ConfigError(f"clock.model={preset!r}: not a model preset (valid: {valid})")
    _check_simulated_clock(clock)


def _check_simulated_clock(clock: Any) -> None:
    """A simulated clock checks its GPU, cost model, TP degree and profile files when built (cheap:
    no model): build it here, so a bad one fails at compose time, not after the model has loaded."""
    if not isinstance(clock, DictConfig) or clock.get("_target_") != "forge.sim.clock.SimulatedClock":
        return
    _check_by_building(clock)


def _check_by_building(node: DictConfig) -> None:
    """Build ``node``'s target (one whose constructor is cheap and checks its arguments): a
    ``ValueError`` it raises becomes a ``ConfigError``; one whose interpolations cannot be resolved yet
    (``${oc.env:...}`` of a variable the job's environment will have) is left to the job."""
    try:
        params = OmegaConf.to_container(node, resolve=True)
    except InterpolationResolutionError:
        return
    if not isinstance(params, dict):
        return
    target = get_object(str(params.pop("_target_")))
    try:  # (Hydra's own keys, ``_recursive_`` and the like, are not the target's)
        target(**{str(k): v for k, v in params.items() if not str(k).startswith("_")})
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _check_cluster(cfg: DictConfig) -> None:
    """``cluster`` and ``router`` (``forge.cluster``, ``forge.routers``): built here (cheap, no engine),
    so a pool of 0 replicas, a per-replica list of the wrong length or a bad router setting fails at
    compose time as one line."""
    for group in ("cluster", "router"):
        node = cfg.get(group)
        if isinstance(node, DictConfig) and "_target_" in node:
            _check_by_building(node)


def check_one_engine(cfg: DictConfig) -> None:
    """A config that asks for several replicas (``cluster.replicas`` > 1, ``cluster=disaggregated``)
    cannot be built as one engine (``build_engine``: ``forge serve``, the ``LLM`` class): refused
    rather than ignored. The cluster layer builds each replica from a config without the cluster."""
    node = cfg.get("cluster")
    if isinstance(node, DictConfig) and ("prefill_replicas" in node or node.get("replicas", 1) != 1):
        raise ConfigError(
            "cluster: forge serve and the LLM class run one engine; several replicas (cluster.replicas > 1, "
            "cluster=disaggregated) run offline (python run.py)"
        )


def _check_server(cfg: DictConfig) -> None:
    """The ``server`` settings' types, then their values (``ServerSettings`` checks them when built)."""
    server = cfg.get("server")
    if isinstance(server, DictConfig) and "_target_" in server:
        check_node("server", server)
        _check_by_building(server)


def _check_model_paths(cfg: DictConfig) -> None:
    """``model.path`` and ``drafter.model.path``, for the loaders that read one (forge.models.paths)."""
    from forge.models.paths import path_problem

    for where in ("model", "drafter.model"):
        node = OmegaConf.select(cfg, where, default=None)
        if isinstance(node, DictConfig) and node.get("tokenizer", "auto") not in ("auto", "none"):
            raise ConfigError(f"{where}.tokenizer={node.tokenizer!r}: expected auto or none")
        if not isinstance(node, DictConfig) or "path" not in node or not isinstance(node.path, str):
            continue  # "???" (not in node) or a wrong type: check_node's to report
        problem = path_problem(str(node.get("_target_", "")), node.path)
        if problem is not None:
            raise ConfigError(f"{where}.path={node.path!r}: {problem}")


def _check_tensor_parallel(cfg: DictConfig, size: int) -> None:
    if cfg.get("runner") is not None:
        raise ConfigError(f"runner={cfg.runner._target_} and engine.tensor_parallel_size={size} do not combine")
    target = str(cfg.model.get("_target_", ""))
    if "synthetic" in target:
        raise ConfigError(
            f"engine.tensor_parallel_size={size} needs a real model (model=tiny, smollm2, gguf, safetensors): "
            "model=synthetic computes nothing to split; clock.tensor_parallel simulates TP"
        )
    device = str(cfg.backend.get("device", "cpu"))
    if device.startswith("cuda") or "cuda" in str(cfg.backend.get("_target_", "")):
        import torch

        if torch.cuda.device_count() < size:
            raise ConfigError(
                f"engine.tensor_parallel_size={size} on CUDA needs {size} GPUs, {torch.cuda.device_count()} visible"
            )


def validate_settings(cfg: DictConfig) -> None:
    """The checks of ``validate`` that import no component (no model, backend or torch; the server's
    settings only), so they answer in well under a second: the schema's keys, the server's settings,
    the model's dtype, the pool's sizes, the engine's numbers and the model's path."""
    _check_schema_keys(cfg)
    _check_server(cfg)
    _check_model_dtypes(cfg)
    _check_kvcache_sizes(cfg)
    _check_engine_numbers(cfg.engine)
    _check_model_paths(cfg)


def validate(cfg: DictConfig) -> None:
    _check_schema_keys(cfg)
    for group in (*GROUPS, "drafter", "runner", "structured", "server", "embedding", "cluster", "router"):
        node = cfg.get(group)
        if node is not None:
            check_node(group, node)
    _check_server(cfg)
    _check_cluster(cfg)
    _check_model_dtypes(cfg)
    _check_kvcache_sizes(cfg)
    _check_clock_presets(cfg)
    _check_engine_numbers(cfg.engine)
    if cfg.engine.tensor_parallel_size > 1:
        _check_tensor_parallel(cfg, cfg.engine.tensor_parallel_size)
    _check_backend_kv_dtype(cfg)
    _check_model_paths(cfg)
    if (problem := timing_only_problem(cfg)) is not None:
        raise ConfigError(problem)


def _check_engine_numbers(e: DictConfig) -> None:
    for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if e[name] is not None and e[name] < 1:
            raise ConfigError(f"engine.{name} must be >= 1, got {e[name]}")
    if e.preemption_mode not in ("recompute", "swap"):
        raise ConfigError(f"engine.preemption_mode must be recompute or swap, got {e.preemption_mode!r}")
    if e.kv_cache_dtype not in KV_CACHE_DTYPES:
        choices = ", ".join(KV_CACHE_DTYPES)
        raise ConfigError(f"engine.kv_cache_dtype must be one of {choices}, got {e.kv_cache_dtype!r}")
    if e.tensor_parallel_size < 1:
        raise ConfigError(f"engine.tensor_parallel_size must be >= 1, got {e.tensor_parallel_size}")
    if not e.distributed_timeout_s > 0:
        raise ConfigError(f"engine.distributed_timeout_s must be > 0, got {e.distributed_timeout_s}")
    if e.kv_cache_memory_gib is not None and not (math.isfinite(e.kv_cache_memory_gib) and e.kv_cache_memory_gib > 0):
        raise ConfigError(f"engine.kv_cache_memory_gib must be a finite number > 0, got {e.kv_cache_memory_gib}")
