"""Driving a Scheduler without a model: every sampled position yields a fixed token."""

from __future__ import annotations

from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kvcache.base import KVCacheManager
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.base import Policy
from forge.policies.fcfs import FCFS
from forge.sched.scheduler import Scheduler, SchedulerLimits
from forge.sched.step_outputs import StepOutputs


def request(
    rid: str,
    prompt: list[int] | int,
    max_tokens: int = 4,
    arrival: float = 0.0,
    priority: int = 0,
    expected_output_len: int | None = None,
) -> Request:
    """A greedy request that ignores EOS; an int ``prompt`` means the tokens 1..prompt."""
    ids = list(range(1, prompt + 1)) if isinstance(prompt, int) else prompt
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return Request(rid, ids, params, arrival, priority=priority, expected_output_len=expected_output_len)


def scheduler(
    kv: KVCacheManager | None = None,
    policy: Policy | None = None,
    max_num_seqs: int = 256,
    budget: int = 512,
    max_model_len: int = 4096,
    preemption_mode: str = "recompute",
) -> Scheduler:
    kv = kv if kv is not None else PagedKVCache(KVCacheContext(64, 4), enable_prefix_caching=True)
    limits = SchedulerLimits(max_num_seqs, budget, max_model_len, True, preemption_mode)
    return Scheduler(policy or FCFS(), kv, limits)


def step(sched: Scheduler, token: int = 7) -> tuple[SchedulerOutput, StepOutputs]:
    so = sched.schedule()
    out = ModelOutput({s.request_id: [token] for s in so.scheduled if s.sample})
    return so, sched.update(so, out, frozenset())


def drain(sched: Scheduler, max_steps: int = 100_000) -> int:
    steps = 0
    while sched.num_unfinished:
        step(sched)
        steps += 1
        assert steps < max_steps, "scheduler made no progress"
    return steps
