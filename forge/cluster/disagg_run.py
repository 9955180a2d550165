"""``cluster=disaggregated``: its two pools built, run, and their records merged."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from forge.cluster.build import build_pool, build_router, check_requests
from forge.cluster.disagg import DisaggregatedCluster
from forge.cluster.disagg_results import disaggregated_frames, pool_summary
from forge.cluster.records import ClusterRun, Records
from forge.cluster.spec import DisaggregatedSpec
from forge.config import CONF_DIR, ConfigError
from forge.core.request import Request


def build_disaggregated(cfg: DictConfig, spec: DisaggregatedSpec) -> ClusterRun:
    if cfg.clock.get("_target_") != "forge.sim.clock.SimulatedClock":
        raise ConfigError("cluster=disaggregated needs clock=simulated (the KV transfer is simulated)")
    if (problem := _sampling_problem(cfg)) is not None:
        raise ConfigError(f"cluster=disaggregated {problem}")
    prefill = build_pool(cfg, spec.prefill, build_router(cfg))
    decode = build_pool(cfg, spec.decode, build_router(cfg, _decode_router_node(cfg, spec.decode_router)))
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
    if not (cfg.workload.get("ignore_eos", False) or (sampling is not None and sampling.get("ignore_eos"))):
        return (
            "needs workload.ignore_eos=true (the decode replica does not receive the prompt's token states, only "
            "their timing: docs/cluster.md)"
        )
    if sampling is not None and sampling.get("stop_token_ids"):
        return "needs no sampling.stop_token_ids (a stop would end an output on tokens the decode replica lacks)"
    if sampling is not None and (sampling.get("n") or 1) > 1:
        return "needs sampling.n=1 (the handoff of a prompt's n forked sequences is not modelled)"
    return None


def _decode_router_node(cfg: DictConfig, node: Any) -> Any:
    """``cluster.decode_router``: a router's config, or the name of a ``conf/router`` option (``least_kv``,
    its interpolations, ``${seed}``, resolved against the run's config); None: the run's ``router``."""
    if node is None:
        return cfg.get("router")
    if not isinstance(node, str):
        return node
    path = CONF_DIR / "router" / f"{node}.yaml"
    if not path.is_file():
        options = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ConfigError(f"cluster.decode_router={node!r}: not a router option ({options})")
    return OmegaConf.create({"seed": cfg.get("seed", 0), "router": OmegaConf.load(path)}).router
