"""Vidur's predicted time of given batch shapes (issue 35's cost-model grid), from its own predictor.

Runs under Vidur's venv from Vidur's source checkout (``benchmarks/vidur_setup.sh``), like
``experiments/vidur_reference.py`` and with its configuration; imports nothing of forge's::

    cd /work/vidur-src && /work/vidur-venv/bin/python /path/to/forge/experiments/vidur_predict.py SHAPES.json OUT.json

SHAPES.json: a list of ``{"query_lens": [...], "seq_lens": [...]}`` (forge's ``BatchShape``: new tokens
and context after the step, per request; a query of 1 is a decode). OUT.json: Vidur's model time of
each (seconds; ``ExecutionTime.model_time``: every layer, no CPU overheads, as Vidur simulates by
default; its table extended to 256 decodes). A decode at context s after the step is a request Vidur
has processed s - 1 tokens of; a prefill chunk of q tokens ending at s is one with s - q tokens
processed and its prefill not complete. Several chunks are looked up at their summed cached context
(Vidur's aggregation), which its table holds up to 4,096 tokens: the grid stays within it."""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def predictor() -> Any:
    from vidur.config import SimulationConfig
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry

    sys.argv = ["vidur", "--replica_config_model_name=meta-llama/Llama-2-7b-hf", "--replica_config_device=a100"]
    sys.argv += ["--replica_scheduler_config_type=vllm", "--vllm_scheduler_config_batch_size_cap=128"]
    sys.argv += ["--vllm_scheduler_config_max_tokens_in_batch=4096", "--metrics_config_output_dir=/tmp/vidur-predict"]
    # its table of predictions stops at 128 decodes by default; the grid asks up to 256 (its profile ends at
    # 128: its forests hold the last measured values beyond)
    sys.argv += ["--random_forrest_execution_time_predictor_config_prediction_max_batch_size=256"]
    config = SimulationConfig.create_from_cli_args()
    return ExecutionTimePredictorRegistry.get(
        config.execution_time_predictor_config.get_type(),
        predictor_config=config.execution_time_predictor_config,
        replica_config=config.cluster_config.replica_config,
        replica_scheduler_config=config.cluster_config.replica_scheduler_config,
        metrics_config=config.metrics_config,
    )


def batch(query_lens: list[int], seq_lens: list[int]) -> Any:
    from vidur.entities import Batch, Request

    requests = []
    for q, s in zip(query_lens, seq_lens, strict=True):
        if q == 1:  # a decode: its prompt done, s - 1 tokens processed
            req = Request(arrived_at=0.0, num_prefill_tokens=s - 1, num_decode_tokens=2)
            req._num_processed_tokens, req._is_prefill_complete = s - 1, True
        else:  # a prefill chunk after s - q processed tokens
            req = Request(arrived_at=0.0, num_prefill_tokens=s, num_decode_tokens=2)
            req._num_processed_tokens = s - q
        requests.append(req)
    return Batch(0, requests, list(query_lens))


def main() -> None:
    sys.path.insert(0, os.getcwd())  # Vidur's source checkout, not this script's directory
    shapes_path, out_path = sys.argv[1], sys.argv[2]
    with open(shapes_path) as f:
        shapes = json.load(f)
    model = predictor()
    times = [model.get_execution_time(batch(s["query_lens"], s["seq_lens"]), 0).model_time for s in shapes]
    with open(out_path, "w") as f:
        json.dump(times, f)


if __name__ == "__main__":
    main()
