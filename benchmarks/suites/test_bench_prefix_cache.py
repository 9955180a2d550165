"""Control-plane cost of one decode step (schedule + update, no model) at 256 running requests with
prefix caching on. Goal: <= 0.6 ms per step (nano-vllm's scheduler + block manager: ~0.67 ms @256 on the
development machine). Run: python -m pytest benchmarks/suites --benchmark-enable -q"""

from __future__ import annotations

from typing import Any

from forge.core.outputs import ModelOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.fcfs import FCFS
from forge.sched.scheduler import Scheduler, SchedulerLimits

NUM_SEQS, PROMPT, BLOCK = 256, 256, 16


def decoding_scheduler(policy: Any = None) -> Scheduler:
    """256 requests past their prompts (half of each prompt a shared system prompt), all decoding."""
    kv = PagedKVCache(KVCacheContext(NUM_SEQS * 1024, BLOCK), enable_prefix_caching=True)
    limits = SchedulerLimits(max_num_seqs=NUM_SEQS, max_num_batched_tokens=8192, max_model_len=1 << 14)
    sched = Scheduler(policy or FCFS(), kv, limits)
    params = SamplingParams(max_tokens=1 << 14, temperature=0.0, ignore_eos=True)
    system = list(range(1000, 1000 + PROMPT // 2))
    for i in range(NUM_SEQS):
        prompt = system + [(i * 31 + j) % 30000 for j in range(PROMPT // 2)]
        sched.add_request(Request(f"r{i}", prompt, params))
    while len(sched.running) < NUM_SEQS or any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.running):
        step(sched)
    return sched


def step(sched: Scheduler) -> None:
    so = sched.schedule()
    out = ModelOutput({s.request_id: [7] for s in so.scheduled if s.sample})
    sched.update(so, out, frozenset())


def test_decode_step_256_prefix_caching(benchmark: Any) -> None:
    sched = decoding_scheduler()
    assert sched.kv.stats()["prefix_cache_hits"] > 0
    benchmark.pedantic(step, args=(sched,), rounds=500, warmup_rounds=20)
    so = sched.schedule()
    assert len(so.scheduled) == NUM_SEQS and so.num_batched_tokens == NUM_SEQS  # still all decoding
