"""The scheduling policies' orderings, driven without a model. That greedy outputs never depend on
the policy (with the real engine) is tests/test_conformance.py's, for every conf/scheduler option."""

from __future__ import annotations

from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.base import Policy
from forge.policies.decode_first import DecodeFirst
from forge.policies.fcfs import FCFS
from forge.policies.lpm import LPM
from forge.policies.prefill_first import PrefillFirst
from forge.policies.sarathi import Sarathi
from forge.policies.sjf import SJF
from forge.sched.scheduler import Scheduler
from tests.sched_helpers import drain, request, scheduler, step


def admitted_order(sched: Scheduler, n: int) -> list[str]:
    order: list[str] = []
    for _ in range(10_000):
        so, _ = step(sched)
        order += [s.request_id for s in so.scheduled if s.request_id not in order]
        if len(order) >= n:
            return order
    raise AssertionError(f"only {order} admitted")


def test_sjf_by_prompt_and_by_oracle_output() -> None:
    sched = scheduler(policy=SJF(), max_num_seqs=1)
    sched.add_request(request("long", 30, max_tokens=1, arrival=0.0))
    sched.add_request(request("short", 5, max_tokens=50, arrival=1.0))
    sched.add_request(request("mid", 10, max_tokens=20, arrival=2.0))
    assert admitted_order(sched, 3) == ["short", "mid", "long"]

    sched = scheduler(policy=SJF(oracle=True), max_num_seqs=1)
    sched.add_request(request("a", 30, max_tokens=9, arrival=0.0, expected_output_len=2))
    sched.add_request(request("b", 5, max_tokens=9, arrival=1.0, expected_output_len=8))
    sched.add_request(request("c", 10, max_tokens=4, arrival=2.0))  # unknown: max_tokens
    assert admitted_order(sched, 3) == ["a", "c", "b"]


def _mixed(policy: Policy) -> Scheduler:
    """Two requests decoding, then a 40-token prompt arrives; budget 16 tokens per step."""
    sched = scheduler(policy=policy, budget=16)
    sched.add_request(request("d1", 4, max_tokens=20))
    sched.add_request(request("d2", 4, max_tokens=20))
    step(sched)
    sched.add_request(request("p", list(range(100, 140)), max_tokens=2))
    return sched


def test_decode_first_never_stalls_decodes() -> None:
    sched = _mixed(DecodeFirst())
    chunks = []
    for _ in range(3):
        so, _ = step(sched)
        assert [s.request_id for s in so.scheduled] == ["d1", "d2", "p"]
        chunks.append(so.scheduled[2].num_tokens)
    assert chunks == [14, 14, 12]  # the prompt fills what the two decodes leave


def test_prefill_first_stalls_decodes_behind_a_prompt() -> None:
    sched = _mixed(PrefillFirst())
    so, _ = step(sched)
    assert [s.request_id for s in so.scheduled] == ["p"] and so.scheduled[0].num_tokens == 16
    so, _ = step(sched)  # the partial prefill still goes before the decodes
    assert [s.request_id for s in so.scheduled] == ["p"]
    so, _ = step(sched)
    # the prompt's last 8 tokens and both decodes share the step (decodes are laid out first, vLLM's layout)
    assert sorted((s.request_id, s.num_tokens) for s in so.scheduled) == [("d1", 1), ("d2", 1), ("p", 8)]


def test_sarathi_caps_each_step_at_its_chunk() -> None:
    sched = scheduler(policy=Sarathi(chunk_size=8), budget=512)
    sched.add_request(request("d", 4, max_tokens=30))
    step(sched)
    sched.add_request(request("p1", 20, max_tokens=2, arrival=1.0))
    sched.add_request(request("p2", 20, max_tokens=2, arrival=2.0))
    seen = []
    while sched.num_unfinished:
        so, _ = step(sched)
        assert so.num_batched_tokens <= 8
        ids = [s.request_id for s in so.scheduled]
        if "d" in [r.request_id for r in sched.running] or "d" in ids:
            assert ids[0] == "d"  # the decode is never stalled
        seen.append(ids)
    # The older prefill is finished before the newer one starts getting chunks beyond the leftover.
    assert seen[0] == ["d", "p1"]


def test_lpm_serves_the_longest_cached_prefix_first() -> None:
    kv = PagedKVCache(KVCacheContext(64, 4), enable_prefix_caching=True)
    sched = scheduler(kv=kv, policy=LPM(), max_num_seqs=1)
    sched.add_request(request("warm", list(range(100, 120)), max_tokens=1))
    drain(sched)
    sched.add_request(request("cold", list(range(1, 21)), max_tokens=1, arrival=1.0))
    sched.add_request(request("half", [*range(100, 108), *range(1, 13)], max_tokens=1, arrival=2.0))
    sched.add_request(request("hot", [*range(100, 116), 9, 9, 9], max_tokens=1, arrival=3.0))
    assert admitted_order(sched, 3) == ["hot", "half", "cold"]
    # Without prefix caching it is FCFS.
    sched = scheduler(kv=PagedKVCache(KVCacheContext(64, 4)), policy=LPM(), max_num_seqs=1)
    for rid, t in (("cold", 1.0), ("half", 2.0), ("hot", 3.0)):
        sched.add_request(request(rid, 12, max_tokens=1, arrival=t))
    assert admitted_order(sched, 3) == ["cold", "half", "hot"]


def test_lpm_falls_back_to_fcfs_on_long_queues() -> None:
    kv = PagedKVCache(KVCacheContext(64, 4), enable_prefix_caching=True)
    sched = scheduler(kv=kv, policy=LPM(max_queue=1), max_num_seqs=1)
    sched.add_request(request("warm", list(range(100, 120)), max_tokens=1))
    drain(sched)
    sched.add_request(request("cold", list(range(1, 21)), max_tokens=1, arrival=1.0))
    sched.add_request(request("hot", [*range(100, 116), 9, 9, 9], max_tokens=1, arrival=3.0))
    assert admitted_order(sched, 2) == ["cold", "hot"]


def test_fcfs_unchanged_by_the_new_hooks() -> None:
    assert FCFS().token_budget(512) == 512 and not FCFS().rekey_each_step
    running = [request("a", 3), request("b", 3)]
    assert FCFS().running_order(running) is running
