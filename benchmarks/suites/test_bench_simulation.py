"""The simulated hot path end to end: a whole simulated run (every step's schedule, the synthetic
model's host forward, update, metrics and the per-operator clock; building the engine and drawing the
workload excluded) on a small trace shaped like issue 16's 10,000-request one: Poisson 10 req/s,
512-token prompts, 128 output tokens, the ``vllm_v0`` policy, Llama-2-7B on an A100.

Run: ``python -m pytest benchmarks/suites --benchmark-enable -q`` (CI runs it once, timing disabled).
The full trace's CPU time: ``reports/fidelity`` (``experiments/fidelity.py``)."""

from __future__ import annotations

from typing import Any

from forge.config import compose_config
from forge.core.request import Request
from forge.engine.build import build_engine, workload_requests
from forge.engine.engine import Engine

NUM_REQUESTS = 200
OVERRIDES = [
    "model=synthetic",
    "clock=simulated",
    "clock.model=llama-2-7b",
    "clock.hardware=a100",
    "clock.cost=operators",
    "scheduler=vllm_v0",
    "engine.max_num_seqs=128",
    "engine.max_num_batched_tokens=4096",
    "engine.enable_chunked_prefill=false",
    "engine.max_model_len=4096",
    "kvcache.num_blocks=7424",
    "workload=fixed",
    f"workload.num_requests={NUM_REQUESTS}",
    "workload.input_len.value=512",
    "workload.output_len.value=128",
    "workload.arrivals._target_=forge.workloads.synthetic.Poisson",
    "+workload.arrivals.rate=10.0",
    "progress=false",
    "report=false",
]


def fresh_run() -> tuple[tuple[Engine, list[Request]], dict[str, Any]]:
    cfg = compose_config(OVERRIDES)
    engine = build_engine(cfg)
    return (engine, workload_requests(cfg, engine)), {}


def simulate(engine: Engine, requests: list[Request]) -> int:
    engine.run(requests)
    return len(engine.recorder.steps)


def test_simulated_run(benchmark: Any) -> None:
    num_steps = benchmark.pedantic(simulate, setup=fresh_run, rounds=20)  # a steadier minimum than 5 rounds
    assert num_steps > 2 * NUM_REQUESTS  # decode steps between the arrivals' prefill steps
