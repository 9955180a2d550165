"""The fast paths of simulated runs give exactly what the general paths give: the synthetic model's
host-only forward (vs. ForwardBatch tensors + sampling), the paged cache's per-request usage count
(vs. a per-block count), the roofline clock's sums over the decode columns (vs. its ``BatchShape``),
and the metrics' vectorised percentiles."""

from __future__ import annotations

import dataclasses
import math
import random

import numpy as np
import pytest
import torch

from forge.config import compose_config
from forge.core.outputs import DecodeRows, ScheduledRequest, SchedulerOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine, workload_requests
from forge.engine.engine import Engine
from forge.engine.sim_runner import SimulationRunner
from forge.kernels.batch import build_forward_batch
from forge.kernels.torch_backend import TorchBackend
from forge.kvcache.base import KVCacheManager, KVUsage
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.models.synthetic import SyntheticModel
from forge.results.metrics import percentiles
from forge.sim.clock import PredictedClock
from forge.sim.cost_model import BatchShape, FastCostModel
from forge.tokenizers.base import ByteTokenizer

BASE = ["model=synthetic", "clock=simulated", "workload=sharegpt", "workload.num_requests=24", "progress=false"]
CASES = {
    "greedy": [],
    "random": ["sampling=random"],
    "ngram-drafts": ["drafter=ngram"],
    "forks+prefix": ["sampling=random", "+sampling.n=3", "kvcache.enable_prefix_caching=true"],
    "shared-prefix": ["workload=shared_prefix", "workload.num_requests=12", "kvcache.enable_prefix_caching=true"],
    "order5-bs4": ["model.order=5", "kvcache.block_size=4", "engine.max_num_batched_tokens=48"],
    "swap": ["kvcache.num_blocks=140", "engine.preemption_mode=swap", "kvcache.num_cpu_blocks=140"],
}


def run(overrides: list[str], host: bool) -> tuple[dict[str, list[int]], Engine]:
    cfg = compose_config([*BASE, *overrides])
    engine = build_engine(cfg)
    runner = engine.runner
    assert isinstance(runner, SimulationRunner) and runner.host  # the synthetic model on CPU: host path
    runner.host = host
    finals = engine.run(workload_requests(cfg, engine))
    return {rid: out.token_ids for rid, out in finals.items()}, engine


@pytest.mark.parametrize("case", sorted(CASES))
def test_host_path_matches_tensor_path(case: str) -> None:
    fast, e1 = run(CASES[case], host=True)
    slow, e2 = run(CASES[case], host=False)
    assert fast == slow and len(fast) >= 12
    assert e1.recorder.steps_frame().equals(e2.recorder.steps_frame())
    assert e1.recorder.requests_frame().equals(e2.recorder.requests_frame())


def _row(
    model: SyntheticModel, cache: list[tuple[torch.Tensor, torch.Tensor]], table: list[int], pos: int, token: int
) -> int:
    """The token sampled after decoding ``token`` at ``pos`` (on a copy of the cache: reads only), as a
    column-wise decode row; the same row as a one-token chunk gives the same token."""
    copy = [(k.clone(), v.clone()) for k, v in cache]
    decode = SchedulerOutput([], 1, decodes=DecodeRows(["a"], [pos], [token], [table]))
    chunk = SchedulerOutput([ScheduledRequest("a", pos, 1, [token], table, True)], 1)
    tokens = [model.forward_host(s, 16, [(k.clone(), v.clone()) for k, v in copy]).tokens[0] for s in (decode, chunk)]
    assert tokens[0] == tokens[1]
    return tokens[0]


def test_host_path_reads_its_context_from_the_cache() -> None:
    model = SyntheticModel(seed=3)
    backend = TorchBackend("cpu")
    prompt = [40 + (7 * i) % 80 for i in range(48)]
    table = [5, 2, 7]
    cache = backend.allocate_kv_cache(model.kv_spec, 8, 16)
    model.forward_host(SchedulerOutput([ScheduledRequest("a", 0, 48, prompt, table, False)], 48), 16, cache)
    good = [_row(model, cache, table, p, prompt[p]) for p in range(48)]
    # The tensor path agrees row for row.
    for pos in (0, 1, 2, 15, 16, 17, 47):
        s = ScheduledRequest("a", pos, 1, [prompt[pos]], table, True)
        batch = build_forward_batch(SchedulerOutput([s], 1), 16, torch.device("cpu"))
        assert int(model.forward(batch, cache, backend).argmax()) == good[pos]
    # A cache that mixes blocks (another request's block in the table) changes the output.
    other = [90 - (3 * i) % 50 for i in range(16)]
    model.forward_host(SchedulerOutput([ScheduledRequest("b", 0, 16, other, [1], False)], 16), 16, cache)
    mixed = [_row(model, cache, [5, 1, 7], p, prompt[p]) for p in range(16, 32)]
    assert sum(a != b for a, b in zip(good[16:32], mixed, strict=True)) > 8
    # A cache that loses its contents changes the output.
    for k, v in cache:
        k.zero_()
        v.zero_()
    lost = [_row(model, cache, table, p, prompt[p]) for p in range(48)]
    assert sum(a != b for a, b in zip(good, lost, strict=True)) > 24


def reference_usage(kv: PagedKVCache, requests: list[Request]) -> KVUsage:
    """Per-block count over the public block tables (a block shared by k holders counts once)."""
    bs = kv.block_size
    tables = kv.holders()
    filled: dict[int, int] = {}
    for r in requests:
        table = tables.get(r.request_id)
        if not table:
            continue
        computed = min(r.num_computed_tokens, len(table) * bs)
        for i, b in enumerate(table):
            filled[b] = max(filled.get(b, 0), min(max(computed - i * bs, 0), bs))
    tokens = sum(filled.values())
    free = kv.num_free_blocks() * bs
    return KVUsage(kv.num_blocks * bs, tokens, 0, len(filled) * bs - tokens, 0, free)


@pytest.mark.parametrize("case", ["greedy", "ngram-drafts", "forks+prefix", "shared-prefix", "swap"])
def test_paged_usage_matches_per_block_count(case: str) -> None:
    cfg = compose_config([*BASE, *CASES[case]])
    engine = build_engine(cfg)
    kv = engine.scheduler.kv
    assert isinstance(kv, PagedKVCache)
    pending = sorted(workload_requests(cfg, engine), key=lambda r: r.arrival_time)
    for r in pending:
        r.arrival_time = 0.0
        engine.add_request(r)
    checked = 0
    while engine.has_unfinished():
        engine.step()
        running = engine.scheduler.running
        assert kv.usage(running) == reference_usage(kv, running)
        checked += 1
    assert checked > 50


def test_percentiles_skip_missing_values() -> None:
    values = [None, 0.002, math.nan, 0.001, 0.004, None]
    arr = np.array([0.002, 0.001, 0.004])
    got = percentiles(values, "x")
    assert got["mean_x_ms"] == float(arr.mean() * 1e3)
    assert got["p90_x_ms"] == float(np.percentile(arr, 90) * 1e3)
    assert percentiles([None, math.nan], "x") == {} and percentiles([], "x") == {}


@pytest.mark.parametrize("case", ["greedy", "ngram-drafts", "forks+prefix", "shared-prefix", "order5-bs4", "swap"])
def test_clock_sums_match_the_batch_shape(case: str) -> None:
    """The roofline clock's sums over a step (decodes summed column-wise) give what its
    ``BatchShape`` gives, and the same with every row as a ``ScheduledRequest`` chunk."""
    cfg = compose_config([*BASE, *CASES[case], "engine.fast_paths=false"])  # every step through schedule
    engine = build_engine(cfg)
    steps: list[SchedulerOutput] = []
    schedule = engine.scheduler.schedule

    def recording() -> SchedulerOutput:
        sched = schedule()
        steps.append(sched)
        return sched

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    engine.run(workload_requests(cfg, engine))
    prompt = {rid: tl.num_prompt_tokens for rid, tl in engine.recorder.requests.items()}
    clock = engine.clock
    assert isinstance(clock, PredictedClock)
    cost = clock.cost_model
    decodes = 0
    assert isinstance(cost, FastCostModel)
    for sched in steps:
        assert sched.num_batched_tokens == sum(s.num_tokens for s in sched.scheduled)
        expected = cost.step_time(BatchShape.of(sched))
        as_chunks = dataclasses.replace(
            sched, chunks=sched.scheduled, decodes=DecodeRows(), chunk_requests=sched.requests
        )
        assert cost.step_time_of(sched) == expected == cost.step_time_of(as_chunks)
        decodes += sum(s.num_tokens == 1 and s.start >= prompt[s.request_id] for s in sched.scheduled)
    assert len(steps) > 50 and decodes > 500


def test_random_prompt_tokens_are_the_token_by_token_draws() -> None:
    """The byte tokenizer draws its prompt tokens in bulk yet gets exactly the tokens, and leaves the
    generator exactly where, drawing 7 bits per try one try at a time, it would."""

    def one_at_a_time(n: int, rng: random.Random) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            r = rng.getrandbits(7)
            if r < 95:
                out.append(32 + r)
        return out

    tokenizer = ByteTokenizer()
    for seed in range(20):
        bulk, single = random.Random(seed), random.Random(seed)
        for n in (0, 1, 15, 16, 17, 100, 512):
            assert tokenizer.random_token_ids(n, bulk) == one_at_a_time(n, single)
            assert bulk.getstate() == single.getstate()


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_paged_decode_slot_is_allocate_slots_then_block_table(prefix_caching: bool) -> None:
    """``PagedKVCache.decode_slot`` (no allocation call inside a block it holds alone) does what the
    contract's definition does, across block boundaries, copy-on-write after a fork and a full pool."""
    caches = [PagedKVCache(KVCacheContext(9, 4), enable_prefix_caching=prefix_caching) for _ in range(2)]
    slots = [caches[0].decode_slot, lambda r: KVCacheManager.decode_slot(caches[1], r)]
    parents = [Request("p", list(range(1, 7)), SamplingParams(max_tokens=64)) for _ in caches]
    children = [Request("c", list(range(1, 7)), SamplingParams(max_tokens=64)) for _ in caches]
    for kv, parent, child in zip(caches, parents, children, strict=True):
        assert kv.allocate_slots(parent, 6, 6)
        parent.num_computed_tokens = 6
        assert kv.fork(parent, child, 5)
        child.num_computed_tokens = 5
        parent.output_token_ids.append(7)
    results = []
    for step in range(30):
        for slot, kv, parent, child in zip(slots, caches, parents, children, strict=True):
            got = [slot(r) for r in ((parent, child) if step else (parent,))]
            results.append((got, kv.num_free_blocks(), kv.take_block_ops(), kv.holders()))
            for r, table in zip((parent, child), got, strict=False):
                if table is not None:
                    r.num_computed_tokens += 1
                    r.output_token_ids.append(40 + step % 3)
        assert results[-1] == results[-2]
    assert any(got[0] is None for got, *_ in results) and any(ops.copy_blocks for _, _, ops, _ in results)
