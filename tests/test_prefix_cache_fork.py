"""Parallel sampling over forked KV: the memory it saves on an Alpaca-like workload (vLLM Fig. 15
reports 6.09 / 8.53 / 9.79% for n = 2 / 4 / 6). Print the figures with ``-s``."""

from __future__ import annotations

import dataclasses

import pytest

from forge.config import compose_config
from forge.engine.build import build_engine, workload_requests
from forge.kvcache.sharing import Sharing, block_sharing

PAPER = {2: 6.09, 4: 8.53, 6: 9.79}


def alpaca_saving(n: int, num_requests: int, block_size: int = 16) -> tuple[float, int]:
    """Time-averaged share of KV blocks saved by sharing (sum over steps of physical vs logical)."""
    cfg = compose_config(
        [
            "model=synthetic",
            "clock=simulated",
            "workload=alpaca",
            f"workload.num_requests={num_requests}",
            f"kvcache.block_size={block_size}",
            "kvcache.num_blocks=20000",
            "engine.max_num_seqs=1024",
            "engine.max_num_batched_tokens=4096",
        ]
    )
    engine = build_engine(cfg)
    requests = workload_requests(cfg, engine)
    for r in requests:
        r.sampling_params = dataclasses.replace(r.sampling_params, n=n)
    pending = sorted(requests, key=lambda r: r.arrival_time)
    total = Sharing(0, 0)
    i = 0
    while i < len(pending) or engine.has_unfinished():
        if not engine.has_unfinished():
            engine.clock.wait_until(pending[i].arrival_time)
        while i < len(pending) and pending[i].arrival_time <= engine.clock.now():
            engine.add_request(pending[i])
            i += 1
        engine.step()
        total = total + block_sharing(engine.scheduler.kv, [r.request_id for r in engine.scheduler.running])
    engine.check_idle()
    assert engine.scheduler.num_preemptions == 0
    return 100 * total.saved_fraction, engine.scheduler.kv.stats()["kv_cow_copies"]


def test_no_sharing_without_forks() -> None:
    saved, copies = alpaca_saving(1, 40)
    assert saved == 0.0 and copies == 0


@pytest.mark.parametrize("n", [2, 4, 6])
def test_parallel_sampling_saves_memory_on_alpaca(n: int) -> None:
    saved, copies = alpaca_saving(n, 100)
    print(f"\nn={n}: {saved:.2f}% of KV blocks saved by sharing (vLLM paper: {PAPER[n]}%), {copies} CoW copies")
    assert copies > 0
    assert 0 < saved < 100 * (n - 1) / n
