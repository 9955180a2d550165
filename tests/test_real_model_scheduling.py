"""SmolLM2 through every scheduler and cache option of the skeleton: greedy outputs must not
depend on the schedule (batch composition, chunk size, preemption)."""

from __future__ import annotations

import pytest

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.models.base import Model

pytestmark = pytest.mark.realmodel

PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village,",
    "1, 1, 2, 3, 5, 8,",
]
BASE = ["model=smollm2", "model.max_position=512", "engine.max_model_len=512", "backend.num_threads=1"]
SCHEDULES = [
    ["scheduler=fcfs", "kvcache=paged", "engine.max_num_batched_tokens=512"],
    ["scheduler=priority", "kvcache=naive", "engine.max_num_batched_tokens=64"],
    ["scheduler=sarathi", "kvcache=paged", "engine.max_num_batched_tokens=16", "kvcache.block_size=8"],
    # a pool of 8 blocks x 16 forces preemption by recompute
    ["scheduler=fcfs", "kvcache=paged", "kvcache.num_blocks=8", "engine.max_num_batched_tokens=32"],
    # decode attention on the C kernel (reads K/V in place) instead of torch's gathered copy
    ["backend=cpu", "scheduler=sarathi", "engine.max_num_batched_tokens=16"],
]


@pytest.fixture(scope="module")
def model() -> Model:
    return build_engine(compose_config(BASE)).runner.model


def generate(model: Model, overrides: list[str]) -> tuple[list[list[int]], int]:
    engine = build_engine(compose_config([*BASE, *overrides]), model=model)
    tok = model.tokenizer
    requests = [
        Request(f"r{i}", tok.encode(p), SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
        for i, p in enumerate(PROMPTS)
    ]
    finals = engine.run(requests)
    return [list(finals[f"r{i}"].token_ids) for i in range(len(PROMPTS))], engine.scheduler.num_preemptions


def test_greedy_outputs_identical_across_schedules(model: Model) -> None:
    reference, _ = generate(model, ["engine.max_num_seqs=1"])
    preempted = 0
    for schedule in SCHEDULES:
        outputs, n = generate(model, schedule)
        preempted += n
        assert outputs == reference, schedule
    assert preempted > 0  # the last schedule really exercised preemption
