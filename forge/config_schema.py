"""The typed config schema: ``ForgeConfig`` (the top level, registered with Hydra's ``ConfigStore``),
``EngineConfig`` (``engine.*``), the option lists and defaults they refer to, ``ConfigError`` and
``max_model_len_for``, the engine's context length under the model's. ``forge.config`` composes
configs against it; ``forge.config_checks`` validates them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig

from forge.core.errors import CommandError
from forge.kernels import kv_quant

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
