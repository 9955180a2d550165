"""The ``python run.py`` job: run a workload through the engine and write the run directory."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from forge.cluster.run import ClusterRun, build_cluster
from forge.config import validate
from forge.engine.build import default_sampling, workload_requests
from forge.results.metrics import summarize
from forge.results.provenance import git_commit
from forge.results.ragged import write_parquet
from forge.results.redact import redact_config


def oversubscription_warning(load_average: float, cores: int) -> str | None:
    """A warning when the machine is busier than its cores (1-minute load average above them):
    wall-clock timings then measure the neighbours too."""
    if load_average <= cores:
        return None
    return (
        f"the machine was oversubscribed at the start (load average {load_average:.1f} on {cores} cores): "
        "wall-clock latencies include waiting for a core; rerun on an idle machine or use clock=simulated "
        "(torch's threads: backend.num_threads, 1 by default)"
    )


def torch_threads() -> int | None:
    """The threads torch computes with in this process (None when torch was never imported)."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else None


def run_offline(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run the workload and write the run directory; ``timing.json`` there records when the job ran
    (``started_at`` / ``ended_at``, Unix seconds, model build included: what a sweep's overlap checks
    read), kept out of ``summary.json`` so that a simulated run's summary is a function of its config.
    The workload runs on ``cfg.cluster``'s replicas behind ``cfg.router`` (``forge.cluster``; one
    replica, the default: the engine alone)."""
    started_at = time.time()
    validate(cfg)
    cluster = build_cluster(cfg)
    try:
        summary = _run_cluster(cfg, cluster, run_dir)
    finally:
        cluster.close()
    timing = {"started_at": started_at, "ended_at": time.time(), "pid": os.getpid()}
    (run_dir / "timing.json").write_text(json.dumps(timing, indent=2))
    return summary


def _run_cluster(cfg: DictConfig, cluster: ClusterRun, run_dir: Path) -> dict[str, Any]:
    engine = cluster.first
    warnings = []
    load_start = os.getloadavg()[0]
    if not engine.clock.simulated:
        busy = oversubscription_warning(load_start, os.cpu_count() or 1)
        if busy is not None:
            warnings.append(busy)
    default_sampling(cfg)  # a bad sampling.* value is a ConfigError naming it, not a traceback from a request
    records = cluster.run(workload_requests(cfg, engine), cfg.progress)
    summary = summarize(records.requests, records.steps, cluster.counters())
    summary.update(cluster.spec_summary())
    summary.update(records.extra(summary["duration_s"]))
    summary["clock"] = "simulated" if engine.clock.simulated else "wall"
    summary["commit"] = git_commit(Path(__file__).resolve().parent)  # forge's checkout, not the cwd's
    summary["machine"] = f"{platform.node()} {platform.machine()} {platform.processor() or ''}".strip()
    if not engine.clock.simulated:  # what a wall-clock timing depends on besides the code
        summary.update(wall_conditions(load_start))
    if warnings:
        summary["warnings"] = warnings
    _write_run(cfg, run_dir, records.requests, records.steps, summary)
    return summary


def _write_run(cfg: DictConfig, run_dir: Path, req_df: Any, step_df: Any, summary: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_parquet(req_df, run_dir / "requests.parquet")  # (its ITL arrays converted as one array)
    step_df.to_parquet(run_dir / "steps.parquet")
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True))
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(redact_config(cfg)))
    if cfg.report:
        from forge.results.report import write_report

        write_report(run_dir)


def _replicas_line(summary: dict[str, Any]) -> str:
    """The load balance over the replicas, max / mean of each measure (1.00: perfectly even)."""
    balance = ", ".join(
        f"{what} {summary[f'replica_{what}_max_over_mean']:.2f}" for what in ("requests", "tokens", "busy")
    )
    return f"{'replicas (' + str(summary.get('router', '')) + ')':<28}{summary['replicas']}; max/mean: {balance}"


def _pools_line(summary: dict[str, Any]) -> str:
    """A disaggregated run's pools: replicas and busy fraction of each, and the mean KV transfer."""
    pools = ", ".join(
        f"{pool} {summary[f'{pool}_replicas']} ({summary[f'{pool}_busy_fraction']:.0%} busy)"
        for pool in ("prefill", "decode")
    )
    transfer = f"KV transfer {summary.get('mean_kv_transfer_ms', 0.0):.3f} ms mean over {summary['link']}"
    return f"{'pools':<28}{pools}; {transfer}"


def wall_conditions(load_start: float) -> dict[str, Any]:
    """A wall-clock run's conditions: torch's thread count, the cores, and the 1-minute load
    average when the run started and when it ended."""
    return {
        "torch_threads": torch_threads(),
        "cpu_count": os.cpu_count() or 1,
        "load_avg_start": round(load_start, 2),
        "load_avg_end": round(os.getloadavg()[0], 2),
    }


def format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"{'requests':<28}{summary['num_requests']}",
        f"{'duration (s, ' + summary.get('clock', '') + ')':<28}{summary['duration_s']:.3f}",
        f"{'tokens in / out':<28}{summary['total_input_tokens']} / {summary['total_output_tokens']}",
        f"{'throughput (req/s)':<28}{summary['request_throughput']:.2f}",
        f"{'output tok/s':<28}{summary['output_throughput']:.1f}",
        f"{'total tok/s':<28}{summary['total_token_throughput']:.1f}",
        f"{'':<12}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}   (ms)",
    ]
    for key in ("ttft", "tpot", "itl", "e2e"):
        if f"p50_{key}_ms" in summary:
            vals = "".join(f"{summary[f'{s}_{key}_ms']:>10.2f}" for s in ("mean", "p50", "p90", "p99"))
            lines.append(f"{key.upper():<12}{vals}")
    lines.append(f"{'preemptions':<28}{summary['num_preemptions']}")
    lines.append(f"{'peak KV usage':<28}{summary['peak_kv_usage']:.1%}")
    lines.append(f"{'mean batch size':<28}{summary['mean_batch_size']:.1f}")
    if summary.get("prefix_cache_queries"):
        rate = summary["prefix_cache_hits"] / summary["prefix_cache_queries"]
        lines.append(f"{'prefix cache hit rate':<28}{rate:.1%}")
    if "spec_acceptance_rate" in summary:
        lines.append(f"{'spec acceptance rate':<28}{summary['spec_acceptance_rate']:.1%}")
    if "replicas" in summary:
        lines.append(_replicas_line(summary))
    if "prefill_busy_fraction" in summary:
        lines.append(_pools_line(summary))
    if "load_avg_start" in summary:
        threads = f"{summary['torch_threads']} torch threads" if summary.get("torch_threads") else "torch not loaded"
        load = f"load avg {summary['load_avg_start']:.2f} -> {summary['load_avg_end']:.2f}"
        lines.append(f"{'wall-clock conditions':<28}{threads}, {load} on {summary['cpu_count']} cores")
    lines.extend(f"warning: {w}" for w in summary.get("warnings", []))
    return "\n".join(lines)
