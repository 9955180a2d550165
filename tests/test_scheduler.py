"""Scheduler behaviour through its public API, driven with a fake model output."""

from __future__ import annotations

from forge.core.outputs import ModelOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.base import Policy
from forge.policies.fcfs import FCFS
from forge.policies.priority import PriorityPolicy
from forge.sched.scheduler import Scheduler, SchedulerLimits

EOS = frozenset({999})


def req(rid: str, n_prompt: int, max_tokens: int = 4, arrival: float = 0.0, priority: int = 0) -> Request:
    return Request(
        rid,
        list(range(1, n_prompt + 1)),
        SamplingParams(max_tokens=max_tokens, temperature=0),
        arrival_time=arrival,
        priority=priority,
    )


def step(s: Scheduler, token: int = 7) -> tuple[list[str], list[int]]:
    out = s.schedule()
    sampled = {x.request_id: [token] for x in out.scheduled if x.sample}
    s.update(out, ModelOutput(sampled), EOS)
    return [x.request_id for x in out.scheduled], [x.num_tokens for x in out.scheduled]


def make(num_blocks: int = 64, budget: int = 32, max_seqs: int = 8, policy: Policy | None = None) -> Scheduler:
    return Scheduler(
        policy or FCFS(), PagedKVCache(KVCacheContext(num_blocks, 4)), SchedulerLimits(max_seqs, budget, 512)
    )


def test_long_prompt_is_chunked_and_mixed_with_decodes() -> None:
    s = make(budget=16)
    s.add_request(req("a", 4))
    assert step(s) == (["a"], [4])
    s.add_request(req("b", 40))
    ids, counts = step(s)
    assert ids == ["a", "b"] and counts == [1, 15]
    assert step(s) == (["a", "b"], [1, 15])
    assert step(s)[1] == [1, 10]  # a decodes; b's last chunk of 10 finishes its prompt


def test_admission_limited_by_max_num_seqs() -> None:
    s = make(max_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", 3))
    ids, _ = step(s)
    assert ids == ["r0", "r1"]
    assert len(s.waiting) == 2


def test_finished_requests_free_blocks_in_the_same_step() -> None:
    s = make()
    s.add_request(req("a", 4, max_tokens=1))
    step(s)
    assert s.kv.num_free_blocks() == s.kv.num_blocks
    assert s.num_unfinished == 0


def test_eos_stops_unless_ignored() -> None:
    s = make()
    s.add_request(req("a", 4, max_tokens=10))
    s.add_request(Request("b", [1, 2], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)))
    step(s, token=999)
    assert [r.request_id for r in s.running] == ["b"]


def test_preemption_picks_the_policy_victim_and_recomputes() -> None:
    # 6 blocks of 4 tokens: two requests of 8 prompt tokens fill 4 blocks; growth forces preemption.
    s = Scheduler(PriorityPolicy(), PagedKVCache(KVCacheContext(6, 4)), SchedulerLimits(8, 64, 512))
    s.add_request(req("important", 8, max_tokens=12, priority=0))
    s.add_request(req("casual", 8, max_tokens=12, priority=5, arrival=0.0))
    for _ in range(6):
        step(s)
    assert s.num_preemptions >= 1
    victim = next(r for r in list(s.waiting) + s.running if r.request_id == "casual")
    assert victim.num_preemptions >= 1
    while s.num_unfinished:
        step(s)
    assert s.kv.num_free_blocks() == 6


def test_scheduler_output_is_plain_data() -> None:
    s = make()
    s.add_request(req("a", 6))
    out = s.schedule()
    (x,) = out.scheduled
    assert (x.request_id, x.start, x.num_tokens, x.token_ids, x.sample) == ("a", 0, 6, [1, 2, 3, 4, 5, 6], True)
    assert len(x.block_table) == 2
    assert out.num_batched_tokens == 6
