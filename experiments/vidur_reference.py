"""One Vidur run exported as a small reference CSV for forge to replay (issues 32 and 35).

Runs under Vidur's own venv with the working directory at Vidur's source checkout (both laid out by
``benchmarks/vidur_setup.sh``); imports nothing of forge's::

    cd /work/vidur-src && /work/vidur-venv/bin/python /path/to/forge/experiments/vidur_reference.py \\
        --replicas 2 --router round_robin --qps 12 --num-requests 1000 --prefill 512 --decode 128 \\
        --out /path/to/forge/reports/cluster/vidur/rr2-qps12.csv

Vidur's configuration is the one ``reports/fidelity`` compares against (A100, Llama-2-7B, TP1, its
``vllm`` scheduler: 128 sequences, 4,096 batched tokens, block 16, its default KV pool), with its
synthetic request generator (fixed lengths, Poisson intervals, ``--seed``). Its requests are drawn by
Vidur's own generator before the simulation, in its order (request id i = the i-th arrival), and each
row of the CSV holds the request (``arrival_time`` s, ``input_len``, ``output_len``, forge's trace
columns), the ``replica`` Vidur's global scheduler sent it to (recorded from its ``schedule()``) and
Vidur's per-request metrics in seconds: ``ttft_s`` (its
prefill_e2e_time), ``e2e_s`` (request_e2e_time) and ``tpot_s`` = (E2E - TTFT) / (output - 1), as forge
defines TPOT. A JSON beside the CSV records the command line, Vidur's source commit and the attention
profile Vidur ran with (``attention_profile``: ``measured``, Vidur's own; ``transcribed``, the one-GPU
rows of Vidur's own with their medians transcribed from the public copy, what a one-GPU replica reads of
it; or ``computed``, forge's cost model's, as ``benchmarks/vidur_setup.sh`` recorded it in
``ATTENTION_PROFILE``, its sha256 checked against the file). Vidur caches its trained models and their
predictions under ``cache/`` keyed by its config and not by the attention file, so each profile gets its
own cache directory."""

from __future__ import annotations

import argparse
import csv
import glob
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

ROUTERS = ("round_robin", "lor", "random")
ATTENTION = Path("data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv")


def attention_profile() -> dict[str, str]:
    """The attention profile installed in this checkout (``ATTENTION_PROFILE``: label, sha256, origin),
    checked against the file Vidur will read; exits with one line when it is missing or does not match."""
    record = Path("ATTENTION_PROFILE")
    if not ATTENTION.is_file() or not record.is_file():
        sys.exit("vidur_reference: run it from Vidur's source checkout (benchmarks/vidur_setup.sh lays one out)")
    meta = read_profile_record(record)
    digest = hashlib.sha256(ATTENTION.read_bytes()).hexdigest()
    if meta.get("sha256") != digest or meta.get("label") not in ("measured", "transcribed", "computed"):
        sys.exit(
            f"vidur_reference: {ATTENTION} (sha256 {digest}) is not the profile {record} names; rerun vidur_setup.sh"
        )
    return meta


def read_profile_record(record: Path) -> dict[str, str]:
    """``ATTENTION_PROFILE``'s ``key=value`` lines (label, sha256, origin), as ``vidur_setup.sh`` writes them."""
    return dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)


def profile_cache_dir(profile: dict[str, str]) -> str:
    """Vidur's model cache for one attention profile: Vidur keys its cache by config, not by profile, so a
    shared cache would serve one profile's predictions to another."""
    return f"cache/{profile['label']}-{profile['sha256'][:12]}"


def vidur_args(a: argparse.Namespace, out_dir: str, cache_dir: str) -> list[str]:
    """Vidur's command-line flags for this run (vidur.config.SimulationConfig.create_from_cli_args)."""
    return [
        f"--seed={a.seed}",
        f"--cluster_config_num_replicas={a.replicas}",
        "--replica_config_model_name=meta-llama/Llama-2-7b-hf",
        "--replica_config_device=a100",
        "--replica_config_network_device=a100_pairwise_nvlink",
        f"--global_scheduler_config_type={a.router}",
        "--replica_scheduler_config_type=vllm",
        "--vllm_scheduler_config_batch_size_cap=128",
        "--vllm_scheduler_config_max_tokens_in_batch=4096",
        "--request_generator_config_type=synthetic",
        f"--synthetic_request_generator_config_seed={a.seed}",
        f"--synthetic_request_generator_config_num_requests={a.num_requests}",
        "--length_generator_config_type=fixed",
        f"--fixed_request_length_generator_config_prefill_tokens={a.prefill}",
        f"--fixed_request_length_generator_config_decode_tokens={a.decode}",
        "--interval_generator_config_type=poisson",
        f"--poisson_request_interval_generator_config_qps={a.qps}",
        f"--poisson_request_interval_generator_config_seed={a.seed}",
        f"--metrics_config_output_dir={out_dir}",
        f"--metrics_config_cache_dir={cache_dir}",
        "--metrics_config_store_request_metrics",
        "--no-metrics_config_write_json_trace",
        "--no-metrics_config_enable_chrome_trace",
        "--no-metrics_config_store_plots",
    ]


def run_vidur(flags: list[str]) -> tuple[list[Any], dict[int, int], str]:
    """Vidur's requests in arrival order, the replica each went to (by Vidur's request id) and the
    directory its metrics went to; run as ``vidur.main`` runs it."""
    import atexit

    from vidur.config import SimulationConfig
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    sys.argv = ["vidur", *flags]
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    simulator = Simulator(config)
    requests = sorted((event._request for _, event in simulator._event_queue), key=lambda r: r.id)
    replica_of: dict[int, int] = {}
    schedule = simulator.scheduler.schedule

    def recorded() -> list[tuple[int, Any]]:
        mapping = schedule()
        replica_of.update((req.id, replica) for replica, req in mapping)
        return mapping

    simulator.scheduler.schedule = recorded
    simulator.run()
    atexit.unregister(simulator._write_output)
    simulator._write_output()
    return requests, replica_of, config.metrics_config.output_dir


def rows(requests: list[Any], replica_of: dict[int, int], metrics_csv: str) -> list[dict[str, Any]]:
    with open(metrics_csv) as f:
        metrics = {int(float(r["Request Id"])): r for r in csv.DictReader(f)}
    out = []
    for i, req in enumerate(requests):
        m = metrics[req.id]
        ttft, e2e = float(m["prefill_e2e_time"]), float(m["request_e2e_time"])
        decode = int(req.num_decode_tokens)
        out.append(
            {
                "request_id": f"req-{i:06d}",
                "arrival_time": repr(float(req.arrived_at)),
                "input_len": int(req.num_prefill_tokens),
                "output_len": decode,
                "replica": replica_of[req.id],
                "ttft_s": repr(ttft),
                "tpot_s": repr((e2e - ttft) / (decode - 1)) if decode > 1 else "",
                "e2e_s": repr(e2e),
            }
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--router", choices=ROUTERS, default="round_robin")
    p.add_argument("--qps", type=float, required=True)
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    sys.path.insert(0, os.getcwd())  # Vidur's source checkout, not this script's directory
    profile = attention_profile()
    out_dir = tempfile.mkdtemp(prefix=f"vidur-{a.out.stem}-")  # Vidur's own output: not in the repo
    flags = vidur_args(a, out_dir, profile_cache_dir(profile))
    cpu = os.times()
    requests, replica_of, out_dir = run_vidur(flags)
    after = os.times()
    table = rows(requests, replica_of, glob.glob(f"{out_dir}/**/request_metrics.csv", recursive=True)[0])
    a.out.parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    commit = Path("MIRROR_COMMIT").read_text().strip() if Path("MIRROR_COMMIT").is_file() else "unknown"
    meta = {
        "vidur_flags": flags,
        "vidur_source_commit": commit,
        "attention_profile": profile,
        "cpu_s": after.user + after.system - cpu.user - cpu.system,
        "requests": len(table),
    }
    a.out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{a.out}: {len(table)} requests, Vidur {meta['cpu_s']:.1f} CPU-s")


if __name__ == "__main__":
    main()
