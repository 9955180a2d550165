"""Control-plane cost: one decode step of scheduler + KV bookkeeping, no model.

Run: ``python -m pytest benchmarks/suites --benchmark-enable`` (CI runs it with the timing disabled,
as a smoke test). Save a baseline with ``--benchmark-autosave`` and compare with
``--benchmark-compare``.
"""

from __future__ import annotations

from typing import Any

import pytest

from forge.core.outputs import ModelOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kvcache.context import KVCacheContext
from forge.kvcache.naive import NaiveKVCache
from forge.kvcache.paged import PagedKVCache
from forge.policies.fcfs import FCFS
from forge.sched.scheduler import Scheduler, SchedulerLimits

EOS: frozenset[int] = frozenset()
ROUNDS = 500


def decoding_scheduler(num_requests: int, num_blocks: int, kv: str = "paged") -> Scheduler:
    """``num_requests`` requests with 128-token prompts, already prefilled and decoding."""
    cache: Any = (
        PagedKVCache(KVCacheContext(num_blocks, 16))
        if kv == "paged"
        else NaiveKVCache(KVCacheContext(num_blocks, 16, max_model_len=2048), "oracle")
    )
    s = Scheduler(FCFS(), cache, SchedulerLimits(num_requests, 1 << 20, 4096))
    for i in range(num_requests):
        s.add_request(Request(f"r{i}", [i % 250 + 1] * 128, SamplingParams(max_tokens=1 << 20, temperature=0)))
    out = s.schedule()
    s.update(out, ModelOutput({x.request_id: [5] for x in out.scheduled}), EOS)
    return s


def one_step(s: Scheduler) -> None:
    out = s.schedule()
    s.update(out, ModelOutput({x.request_id: [5] for x in out.scheduled}), EOS)


@pytest.mark.parametrize(("num_requests", "num_blocks"), [(64, 16384), (256, 32768), (256, 262144)])
def test_decode_step(benchmark: Any, num_requests: int, num_blocks: int) -> None:
    s = decoding_scheduler(num_requests, num_blocks)
    # A fixed number of steps keeps every request decoding (none reaches max_model_len).
    benchmark.pedantic(one_step, args=(s,), rounds=ROUNDS, warmup_rounds=20)
    assert len(s.running) == num_requests


def test_decode_step_naive(benchmark: Any) -> None:
    s = decoding_scheduler(256, 65536, kv="naive")
    benchmark.pedantic(one_step, args=(s,), rounds=ROUNDS, warmup_rounds=20)
    assert len(s.running) == 256


def test_block_allocate_free(benchmark: Any) -> None:
    cache = PagedKVCache(KVCacheContext(8192, 16))
    reqs = [Request(f"r{i}", [1] * 500, SamplingParams(max_tokens=1)) for i in range(64)]

    def churn() -> None:
        for r in reqs:
            cache.allocate_slots(r, 500, 500)
        for r in reqs:
            cache.free(r)

    benchmark(churn)
    assert cache.num_free_blocks() == 8192
