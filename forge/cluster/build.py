"""Engines for a cluster's replicas, and its router, from the run's composed config."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from forge.cluster.loop import Replica, ReplicaPool
from forge.cluster.spec import ClusterSpec, DisaggregatedSpec, PoolSpec
from forge.config import ConfigError, validate
from forge.core.request import Request
from forge.engine.build import build_engine
from forge.engine.make import make
from forge.models.base import Model
from forge.routers.base import Router


def cluster_spec(cfg: DictConfig) -> ClusterSpec | DisaggregatedSpec:
    """``cfg.cluster`` built (a config without one: one replica)."""
    node = cfg.get("cluster")
    spec: ClusterSpec | DisaggregatedSpec = make("cluster", node) if node is not None else ClusterSpec()
    return spec


def build_router(cfg: DictConfig, node: Any = None) -> Router:
    """The router ``node`` describes (default: ``cfg.router``; none configured: round robin)."""
    node = cfg.get("router") if node is None else node
    if node is None:
        from forge.routers.round_robin import RoundRobin

        return RoundRobin()
    router = make("router", node)
    if not isinstance(router, Router):
        raise ConfigError(f"router: {type(router).__name__} is not a forge.routers.base.Router")
    return router


def replica_config(cfg: DictConfig, where: str, hardware: str | None, overrides: Mapping[str, Any]) -> DictConfig:
    """The run's config with one replica's ``hardware`` (``clock.hardware``) and ``overrides`` merged
    on and no cluster (it describes one engine), validated like the run's own; ``where`` names the
    replica in an error."""
    out = copy.deepcopy(cfg)
    try:
        if hardware is not None:
            if "hardware" not in out.clock:
                raise ConfigError(f"{where}: hardware={hardware} needs a clock with hardware (clock=simulated)")
            out.clock.hardware = hardware
        merged = OmegaConf.merge(out, overrides) if overrides else out
    except OmegaConfBaseException as e:
        raise ConfigError(f"{where}: {str(e).splitlines()[0]}") from None
    assert isinstance(merged, DictConfig)
    out = merged
    out.cluster = None  # the replica is one engine (``build_engine`` refuses a config asking for several)
    try:
        validate(out)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return out


def build_pool(cfg: DictConfig, spec: PoolSpec, router: Router) -> ReplicaPool:
    """An engine per replica of ``spec`` (replicas with the first one's model settings share its
    loaded model: models hold no per-request state) behind ``router``."""
    replicas: list[Replica] = []
    shared: tuple[Any, Model] | None = None
    for i, (hw, overrides) in enumerate(zip(spec.hardware, spec.overrides, strict=True)):
        where = f"cluster replica {i}" if spec.name == "replicas" else f"cluster {spec.name} replica {i}"
        rcfg = replica_config(cfg, where, hw, overrides)
        model = shared[1] if shared is not None and shared[0] == rcfg.model else None
        engine = build_engine(rcfg, model=model)
        if shared is None:
            shared = (rcfg.model, engine.runner.model)
        replicas.append(Replica(i, engine, rcfg.clock.get("hardware"), engine.clock.now()))
    return ReplicaPool(replicas, router)


def check_requests(pool: ReplicaPool, requests: Sequence[Request]) -> None:
    """ConfigError naming the replica and the request when some replica of ``pool`` could never run a
    request of the workload (a KV pool that cannot hold it, a prompt longer than its max_model_len)."""
    for replica in pool.replicas:
        scheduler = replica.engine.scheduler
        if not scheduler.refuses_any(requests):
            continue
        for request in requests:  # the first refused, as a single engine reports it
            if (refusal := scheduler.refusal(request)) is not None:
                where = f"cluster replica {replica.index}: " if len(pool.replicas) > 1 else ""
                raise ConfigError(f"workload: {where}{refusal}")
