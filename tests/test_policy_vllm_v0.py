"""The vllm_v0 policy: prefill-only or decode-only steps, admission keeping a watermark of free KV blocks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.policies.base import Policy
from forge.policies.vllm_v0 import VllmV0
from forge.sched.scheduler import Scheduler, SchedulerLimits
from tests.sched_helpers import drain, request, step

ROOT = Path(__file__).resolve().parent.parent


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


def test_a_prompt_that_can_never_leave_the_watermark_free_is_refused() -> None:
    """10 blocks of 4, watermark 0.25 (2.5 blocks): a prompt of 32 tokens (8 blocks) leaves 2 free even in an
    empty cache, so it could never be admitted: add_request refuses it (the step raised a RuntimeError); one
    of 28 tokens (7 blocks, 3 left free) runs."""
    sched = v0_scheduler(VllmV0(watermark=0.25), num_blocks=10)
    with pytest.raises(ValueError, match="admission watermark"):
        sched.add_request(request("big", 32, max_tokens=2))
    sched.add_request(request("fits", 28, max_tokens=2))
    so, _ = step(sched)
    assert [s.request_id for s in so.scheduled] == ["fits"]
    drain(sched)


def test_run_py_refuses_in_one_line_a_prompt_over_the_watermark(tmp_path: Path) -> None:
    """7 blocks of 16 hold the 104 tokens, but the 7 blocks of the prompt leave none of the 1% watermark free."""
    args = [
        "model=synthetic",
        "clock=simulated",
        "scheduler=vllm_v0",
        "engine.enable_chunked_prefill=false",
        "engine.max_model_len=512",
        "kvcache.num_blocks=7",
        "workload=fixed",
        "workload.input_len.value=100",
        "workload.output_len.value=4",
        "workload.num_requests=2",
        "progress=false",
        "report=false",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    proc = subprocess.run([sys.executable, "run.py", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: workload: request req-000000"), proc.stderr
    assert "admission watermark" in lines[0]
