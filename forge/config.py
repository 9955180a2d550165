"""Hydra composition outside of ``@hydra.main``: ``compose_config`` (the config ``python run.py`` would
see, validated) and ``compose_group`` (one group, checked alone). Hydra is the only registry: every
option is ``conf/<group>/<name>.yaml`` with a ``_target_``.

The typed schema lives in ``forge.config_schema`` (a typo or a wrong type in ``engine`` fails at
compose time; struct mode rejects unknown keys in every group) and the validation of a composed
config in ``forge.config_checks``; their public names are imported from here."""

from __future__ import annotations

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from forge.config_checks import check_node, check_one_engine, validate, validate_settings
from forge.config_schema import (
    CONF_DIR,
    DEFAULT_KV_CACHE_MEMORY_GIB,
    DEFAULT_MAX_MODEL_LEN,
    GROUPS,
    KV_CACHE_DTYPES,
    MODEL_DTYPES,
    ConfigError,
    EngineConfig,
    ForgeConfig,
    max_model_len_for,
    register_schema,
)

__all__ = [
    "CONF_DIR",
    "DEFAULT_KV_CACHE_MEMORY_GIB",
    "DEFAULT_MAX_MODEL_LEN",
    "GROUPS",
    "KV_CACHE_DTYPES",
    "MODEL_DTYPES",
    "ConfigError",
    "EngineConfig",
    "ForgeConfig",
    "check_one_engine",
    "compose_config",
    "compose_group",
    "max_model_len_for",
    "register_schema",
    "validate",
    "validate_settings",
]


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
    check_node(group, node)
    return node
