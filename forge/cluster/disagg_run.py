"""``cluster=disaggregated``: its two pools built, run, and their records merged."""

from __future__ import annotations

from omegaconf import DictConfig

from forge.cluster.build import build_pool, build_router, check_requests
from forge.cluster.disagg import DisaggregatedCluster
from forge.cluster.disagg_results import disaggregated_frames, pool_summary
from forge.cluster.records import ClusterRun, Records
from forge.cluster.spec import DisaggregatedSpec
from forge.config import ConfigError
from forge.core.request import Request


def build_disaggregated(cfg: DictConfig, spec: DisaggregatedSpec) -> ClusterRun:
    if cfg.clock.get("_target_") != "forge.sim.clock.SimulatedClock":
        raise ConfigError("cluster=disaggregated needs clock=simulated (the KV transfer is simulated)")
    if (problem := _sampling_problem(cfg)) is not None:
        raise ConfigError(f"cluster=disaggregated {problem}")
    prefill = build_pool(cfg, spec.prefill, build_router(cfg))
    decode_node = spec.decode_router if spec.decode_router is not None else cfg.get("router")
    decode = build_pool(cfg, spec.decode, build_router(cfg, decode_node))
    cluster = DisaggregatedCluster(prefill, decode, spec.link, spec.layerwise_overlap)

    def run(requests: list[Request], progress: bool) -> Records:
        check_requests(prefill, requests)
        check_requests(decode, requests)
        cluster.run(requests, progress)
        req_df, step_df = disaggregated_frames(cluster)
        return Records(req_df, step_df, lambda duration: pool_summary(cluster, req_df, step_df, duration))

    return ClusterRun([*prefill.replicas, *decode.replicas], run)


def _sampling_problem(cfg: DictConfig) -> str | None:
    """Why the workload's outputs could depend on tokens the decode replica does not have (it receives the
    prompt's KV timing, not its token states: docs/cluster.md), or None."""
    sampling = cfg.get("sampling")
    if not cfg.workload.get("ignore_eos", False):
        return (
            "needs workload.ignore_eos=true (the decode replica does not receive the prompt's token states, only "
            "their timing: docs/cluster.md)"
        )
    if sampling is not None and sampling.get("stop_token_ids"):
        return "needs no sampling.stop_token_ids (a stop would end an output on tokens the decode replica lacks)"
    if sampling is not None and (sampling.get("n") or 1) > 1:
        return "needs sampling.n=1 (the handoff of a prompt's n forked sequences is not modelled)"
    return None
