"""The vllm_v0 policy: prefill-only or decode-only steps, admission keeping a watermark of free KV blocks."""

from __future__ import annotations

import pytest

from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.base import Policy
from forge.policies.vllm_v0 import VllmV0
from forge.sched.scheduler import Scheduler, SchedulerLimits
from tests.sched_helpers import drain, request, step


def v0_scheduler(policy: Policy, num_blocks: int = 64, budget: int = 64) -> Scheduler:
    limits = SchedulerLimits(
        max_num_seqs=8, max_num_batched_tokens=budget, max_model_len=256, enable_chunked_prefill=False
    )
    return Scheduler(policy, PagedKVCache(KVCacheContext(num_blocks, 4)), limits)


def test_a_step_is_prefill_only_or_decode_only() -> None:
    sched = v0_scheduler(VllmV0(watermark=0.0))
    sched.add_request(request("d1", 4, max_tokens=6))
    sched.add_request(request("d2", 4, max_tokens=6))
    so, _ = step(sched)
    assert [(s.request_id, s.num_tokens) for s in so.scheduled] == [("d1", 4), ("d2", 4)]
    sched.add_request(request("p", 12, max_tokens=3, arrival=1.0))
    so, _ = step(sched)  # the new prompt runs alone: the decodes stall
    assert [(s.request_id, s.num_tokens) for s in so.scheduled] == [("p", 12)]
    so, _ = step(sched)
    assert [(s.request_id, s.num_tokens) for s in so.scheduled] == [("d1", 1), ("d2", 1), ("p", 1)]
    kinds = set()
    while sched.num_unfinished:
        so, _ = step(sched)
        kinds.add(frozenset(s.num_tokens == 1 for s in so.scheduled))
    assert kinds <= {frozenset({True}), frozenset({False})}


def test_admission_leaves_the_watermark_free() -> None:
    # 10 blocks of 4; "a" holds 3 after its prompt; "b" needs 5 more, leaving 2 free.
    for watermark, admitted in ((0.2, True), (0.25, False)):
        sched = v0_scheduler(VllmV0(watermark=watermark), num_blocks=10)
        sched.add_request(request("a", 12, max_tokens=2))
        step(sched)
        sched.add_request(request("b", 20, max_tokens=2, arrival=1.0))
        so, _ = step(sched)
        assert ("b" in [s.request_id for s in so.scheduled]) is admitted
        drain(sched)  # once "a" finishes, "b" is admitted either way


def test_watermark_is_validated() -> None:
    with pytest.raises(ValueError, match="scheduler.watermark"):
        VllmV0(watermark=1.5)
