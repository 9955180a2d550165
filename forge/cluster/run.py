"""A workload through the cluster ``cfg.cluster`` describes: its engines built, the requests run, the
records merged. What ``forge.main.run_offline`` calls."""

from __future__ import annotations

from omegaconf import DictConfig

from forge.cluster.build import build_pool, build_router, check_requests, cluster_spec
from forge.cluster.loop import ReplicaPool
from forge.cluster.records import ClusterRun, Records
from forge.cluster.results import load_balance, merged_frames
from forge.cluster.spec import DisaggregatedSpec
from forge.config import ConfigError
from forge.core.request import Request


def build_cluster(cfg: DictConfig) -> ClusterRun:
    """The replicas (and routers) of ``cfg.cluster``, ready to run."""
    spec = cluster_spec(cfg)
    if sum(p.size for p in spec.pools()) > 1 and cfg.engine.tensor_parallel_size > 1:
        raise ConfigError("cluster: several replicas with engine.tensor_parallel_size > 1 are not supported")
    if isinstance(spec, DisaggregatedSpec):
        from forge.cluster.disagg_run import build_disaggregated

        return build_disaggregated(cfg, spec)
    pool = build_pool(cfg, spec.pools()[0], build_router(cfg))
    return ClusterRun(list(pool.replicas), lambda requests, progress: _run_pool(pool, requests, progress))


def _run_pool(pool: ReplicaPool, requests: list[Request], progress: bool) -> Records:
    check_requests(pool, requests)  # the workload is config: a request that can never run is a config error
    pool.run(requests, progress=progress, keep=False)  # the records are the engines': no outputs held
    req_df, step_df = merged_frames(pool.replicas)
    if len(pool.replicas) == 1:
        return Records(req_df, step_df)
    router = type(pool.router).__name__
    return Records(
        req_df, step_df, lambda duration: {"router": router, **load_balance(req_df, step_df, pool.replicas, duration)}
    )
