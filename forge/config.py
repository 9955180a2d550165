"""The typed config schema, composition outside of ``@hydra.main``, and validation of group options.

Hydra is the only registry: every option is ``conf/<group>/<name>.yaml`` with a ``_target_``.
The top-level schema is typed (a typo or a wrong type in ``engine`` fails at compose time);
struct mode rejects unknown keys in every group; ``validate`` checks the composed config's keys
against the schema (``+engine.foo=1`` adds a key struct mode cannot refuse), each option's keys and
scalar types against its target's signature, the model's dtype, the KV pool's sizes and the clock's
model preset: everything the config alone decides, before anything is built or loaded."""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from forge.core.config_types import type_problem
from forge.core.errors import CommandError
from forge.kernels import kv_quant
from forge.kvcache.context import CONTEXT_KEYS
from forge.models.timing_only import timing_only_problem

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
GROUPS = ("model", "scheduler", "kvcache", "backend", "workload", "clock", "sampling")


# engine.kv_cache_dtype: "auto" stores K/V in the model's dtype; int8 and fp8 (= fp8_e4m3, as in
# vLLM) quantize them with a scale per token and KV head (forge.kernels.kv_quant).
KV_CACHE_DTYPES = ("auto", *kv_quant.KV_CACHE_DTYPES)
# model.dtype (and drafter.model.dtype): the floating-point dtypes the models compute in.
MODEL_DTYPES = ("float64", "float32", "bfloat16", "float16")
# engine.max_model_len=null: this many tokens, or the model's context length if that is shorter.
DEFAULT_MAX_MODEL_LEN = 2048
# GiB of KV memory when engine.kv_cache_memory_gib is null and no simulated GPU sizes the pool
DEFAULT_KV_CACHE_MEMORY_GIB = 0.5


class ConfigError(ValueError, CommandError):
    """A setting is invalid; the message names it (a command prints ``config error: ...``, exit 2)."""

    prefix = "config error: "


@dataclass
class EngineConfig:
    """``max_model_len``: tokens per sequence; null = ``DEFAULT_MAX_MODEL_LEN`` capped at the model's
    context length, a number above the model's context length is an error (see ``max_model_len_for``).
    ``kv_cache_memory_gib``: the KV budget ``kvcache.num_blocks=auto`` sizes the pool from; null =
    the simulated GPU's memory less the simulated weights under ``clock=simulated``, else
    ``DEFAULT_KV_CACHE_MEMORY_GIB``. ``fast_paths``: take the fast paths of the components that
    declare them (``forge.core.fast_paths``); false: the plain step loop for every component."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    enable_chunked_prefill: bool = True
    kv_cache_memory_gib: float | None = None
    preemption_mode: str = "recompute"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    distributed_timeout_s: float = 120.0
    fast_paths: bool = True


@dataclass
class ForgeConfig:
    model: Any = None
    scheduler: Any = None
    kvcache: Any = None
    backend: Any = None
    workload: Any = None
    clock: Any = None
    sampling: Any = None
    drafter: Any = None
    runner: Any = None
    structured: Any = None
    server: Any = None
    embedding: Any = None
    cluster: Any = None
    router: Any = None
    engine: EngineConfig = field(default_factory=EngineConfig)
    seed: int = 0
    mode: str = "offline"
    progress: bool = True
    report: bool = True
    output_dir: str = "outputs/run"


def register_schema() -> None:
    ConfigStore.instance().store(name="forge_schema", node=ForgeConfig)


def compose_config(overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """The config ``python run.py <overrides>`` would see (without Hydra's run directory)."""
    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    validate(cfg)
    return cfg


def compose_group(overrides: list[str] | tuple[str, ...], group: str) -> DictConfig:
    """The ``group`` node of the config ``overrides`` compose to, with that group's settings checked as
    ``validate`` checks them and nothing else: for a client that builds only a workload
    (``benchmarks/serve.py``), since checking every group imports every component's module (torch,
    for the default model)."""
    register_schema()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=list(overrides))
    node = cfg[group]
    _check_node(group, node)
    return node


def _check_node(path: str, node: Any) -> None:
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
            _check_node(f"{path}.{key}", value)
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
        _check_node("server", server)
        _check_by_building(server)


def _check_model_paths(cfg: DictConfig) -> None:
    """``model.path`` and ``drafter.model.path``, for the loaders that read one (forge.models.paths)."""
    from forge.models.paths import path_problem

    for where in ("model", "drafter.model"):
        node = OmegaConf.select(cfg, where, default=None)
        if isinstance(node, DictConfig) and node.get("tokenizer", "auto") not in ("auto", "none"):
            raise ConfigError(f"{where}.tokenizer={node.tokenizer!r}: expected auto or none")
        if not isinstance(node, DictConfig) or "path" not in node or not isinstance(node.path, str):
            continue  # "???" (not in node) or a wrong type: _check_node's to report
        problem = path_problem(str(node.get("_target_", "")), node.path)
        if problem is not None:
            raise ConfigError(f"{where}.path={node.path!r}: {problem}")


def max_model_len_for(cfg: DictConfig, model_max_len: int) -> int:
    """The engine's ``max_model_len`` for a model whose context length is ``model_max_len``: the
    configured value, which may not exceed the model's, or (null) the default capped at the model's."""
    wanted = cfg.engine.max_model_len
    if wanted is None:
        return min(DEFAULT_MAX_MODEL_LEN, model_max_len)
    if wanted > model_max_len:
        raise ConfigError(
            f"engine.max_model_len={wanted} exceeds the model's context length of {model_max_len} tokens "
            f"(lower engine.max_model_len, or leave it unset for min({DEFAULT_MAX_MODEL_LEN}, {model_max_len}))"
        )
    return int(wanted)


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
            _check_node(group, node)
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
