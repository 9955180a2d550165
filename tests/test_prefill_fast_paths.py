"""The fast paths of a simulated run's prompt steps give exactly what the plain ones give: the synthetic
model's block-wise prompt write (vs. a write slot by slot) and the token it samples after a chunk (vs.
``next_token`` of the prompt's last tokens), the block pool's one-pass free and allocation (vs. a
reference free list), the KV cache's first allocation of a request without prefix caching (vs. one with), and the
workload's prompts drawn in one go (vs. one prompt after another, the generator left in the same state)."""

from __future__ import annotations

import random
from collections import deque

import numpy as np
import pytest

from forge.core.outputs import ScheduledRequest, SchedulerOutput
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kvcache.block_pool import BlockPool
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.models.synthetic import SyntheticModel
from forge.tokenizers.base import ByteTokenizer, Tokenizer
from forge.workloads.synthetic import Fixed, Poisson, RequestSpec, SyntheticWorkload, Uniform


@pytest.mark.parametrize("native", [True, False])  # forge's C write (where it builds) and the numpy one
@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize(("start", "num_tokens"), [(0, 64), (0, 70), (5, 40), (3, 33), (16, 48), (7, 57), (2, 9)])
def test_prompt_chunk_writes_each_token_to_its_slot(native: bool, block_size: int, start: int, num_tokens: int) -> None:
    """A long chunk (a prompt, possibly starting or ending inside a block) lands where a write slot by
    slot puts it, in both caches, touching no other slot; the token sampled after it is the same."""
    num_blocks = 40
    rng = random.Random(start * 1000 + num_tokens + block_size)
    table = rng.sample(range(num_blocks), -(-(start + num_tokens) // block_size))
    tokens = [rng.randrange(32, 127) for _ in range(num_tokens)]
    k = np.full((num_blocks, block_size, 1, 1), -7, dtype=np.int64)
    v = np.full_like(k, -9)
    expected_k, expected_v = k.reshape(-1).copy(), v.reshape(-1).copy()
    for i, token in enumerate(tokens):
        p = start + i
        slot = table[p // block_size] * block_size + p % block_size
        expected_k[slot] = expected_v[slot] = token
    model = SyntheticModel(seed=5, native=native)
    row = ScheduledRequest("a", start, num_tokens, tokens, table, True)
    logits = model.forward_host(SchedulerOutput([row], num_tokens), block_size, [(k, v)])
    assert k.reshape(-1).tolist() == expected_k.tolist()
    assert v.reshape(-1).tolist() == expected_v.tolist()
    end = start + num_tokens - 1  # the sampled token reads its context back from the cache
    context = tuple(
        int(expected_k[table[q // block_size] * block_size + q % block_size]) for q in range(end - 2, end + 1)
    )
    assert logits.tokens == [model.next_token(context, end)]


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize(
    ("order", "block_size", "seed"), [(1, 1, 0), (2, 4, 1), (3, 16, 0), (3, 16, -1), (5, 4, 2**40), (8, 16, 7)]
)  # the chain tests' models
def test_prompt_chunk_samples_after_its_last_token(native: bool, order: int, block_size: int, seed: int) -> None:
    """The token sampled after a prompt chunk is ``next_token`` of the prompt's last ``order`` tokens
    (-1 before the sequence) at its last position, for every chunk end in or across a block: the
    context read in one piece where it lies in one block equals the one read token by token."""
    num_blocks = 12
    rng = random.Random(order * 31 + block_size)
    prompt = [rng.randrange(32, 127) for _ in range(2 * block_size + order + 1)]
    model = SyntheticModel(seed=seed, order=order, native=native)
    for length in range(1, len(prompt) + 1):
        for start in sorted({0, length - 1, length // 2}):
            table = rng.sample(range(num_blocks), -(-length // block_size))
            k = np.full((num_blocks, block_size, 1, 1), -7, dtype=np.int64)
            v = np.full_like(k, -9)
            if start:  # the chunk's earlier positions were written by an earlier step
                earlier = ScheduledRequest("a", 0, start, prompt[:start], table, False)
                model.forward_host(SchedulerOutput([earlier], start), block_size, [(k, v)])
            row = ScheduledRequest("a", start, length - start, prompt[start:length], table, True)
            logits = model.forward_host(SchedulerOutput([row], length - start), block_size, [(k, v)])
            context = (-1,) * max(order - length, 0) + tuple(prompt[max(length - order, 0) : length])
            assert logits.tokens == [model.next_token(context, length - 1)], (length, start)


@pytest.mark.parametrize(("caching", "num_blocks", "most"), [(False, 24, 6), (True, 24, 6), (False, 1500, 90)])
def test_block_pool_frees_and_allocates_like_a_free_list(caching: bool, num_blocks: int, most: int) -> None:
    """Blocks are handed out from the free list's head and freed ones join its tail in the order given,
    with and without blocks held twice (``acquire``); a block freed twice is refused. Without caching
    the pool's queue is a list from a moving head (compacted as it goes: the 1500-block case), with it
    a linked list: the same order."""
    rng = random.Random(11)
    pool = BlockPool(num_blocks, enable_caching=caching)
    reference = deque(range(num_blocks))
    held: list[list[int]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free([pool.blocks[b] for b in blocks])
            reference.extend(b for b in blocks if pool.blocks[b].ref_cnt == 0)
        elif held and rng.random() < 0.2:  # another holder of some held blocks
            shared = rng.choice(held)[: rng.randint(1, 3)]
            for b in shared:
                pool.acquire(pool.blocks[b])
            held.append(list(shared))
        else:
            n = rng.randint(1, most)
            got = pool.allocate(n)
            if n > len(reference):
                assert got is None
                continue
            assert got is not None
            assert [b.block_id for b in got] == [reference.popleft() for _ in range(n)]
            assert all(b.ref_cnt == 1 for b in got)
            held.append([b.block_id for b in got])
        assert [b.block_id for b in pool.free_queue] == list(reference)
        assert pool.num_free == len(reference)
    block = pool.allocate(1)
    assert block is not None
    pool.free(block)
    with pytest.raises(AssertionError, match="freed twice"):
        pool.free(block)


def test_first_allocation_without_caching_takes_the_blocks_the_general_path_takes() -> None:
    """A request's first ``allocate_slots`` without prefix caching leaves the tables,
    the free blocks and the answer of the general path (a cache with prefix caching, whose distinct random
    prompts never hit), through first chunks, later chunks, refusals (too few free blocks) and frees."""
    rng = random.Random(5)
    caches = [PagedKVCache(KVCacheContext(40, 4), enable_prefix_caching=caching) for caching in (False, True)]
    held: list[Request] = []
    for i in range(300):
        if held and rng.random() < 0.35:
            request = held.pop(rng.randrange(len(held)))
            for kv in caches:
                kv.free(request)
        elif held and rng.random() < 0.3:  # a later chunk of a held request
            request = rng.choice(held)
            end = min(request.num_computed_tokens + rng.randint(1, 20), request.num_tokens)
            assert len({kv.allocate_slots(request, end, end) for kv in caches}) == 1
            request.num_computed_tokens = end
        else:
            prompt = [rng.randrange(32, 127) for _ in range(rng.randint(1, 60))]
            request = Request(f"r{i}", prompt, SamplingParams(max_tokens=4))
            end = rng.randint(1, len(prompt))  # the whole prompt or its first chunk
            answers = {kv.allocate_slots(request, end, end) for kv in caches}
            assert len(answers) == 1
            if answers == {True}:
                request.num_computed_tokens = end
                held.append(request)
            else:
                for kv in caches:
                    kv.free(request)
        assert caches[0].holders() == caches[1].holders()
        assert caches[0].num_free_blocks() == caches[1].num_free_blocks()


class _Sequential(Tokenizer):
    """The byte tokenizer, drawing prompts one after another (the contract's definition)."""

    def __init__(self) -> None:
        self.inner = ByteTokenizer()
        self.vocab_size = self.inner.vocab_size
        self.bos_token_id = self.inner.bos_token_id
        self.eos_token_ids = self.inner.eos_token_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.inner.encode(text, add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:  # type: ignore[override]
        return self.inner.decode(ids, skip_special_tokens)

    def random_token_ids(self, n: int, rng: random.Random) -> list[int]:
        return self.inner.random_token_ids(n, rng)


@pytest.mark.parametrize("lengths", [[], [0], [1, 15, 16, 17, 3], [512] * 40, [700_000, 3, 500_000]])
def test_prompts_drawn_together_are_those_drawn_one_after_another(lengths: list[int]) -> None:
    """Across the bulk draws' size cap too (the last case draws over 2**20 tokens in all)."""
    together, one_by_one = random.Random(8), random.Random(8)
    got = ByteTokenizer().random_token_id_lists(lengths, together)
    assert got == [ByteTokenizer().random_token_ids(n, one_by_one) for n in lengths]
    assert together.getstate() == one_by_one.getstate()


@pytest.mark.parametrize("levels", [1, 3])
def test_synthetic_workload_draws_the_same_requests_as_one_request_at_a_time(levels: int) -> None:
    workload = SyntheticWorkload(300, Poisson(4.0), Uniform(1, 90), Fixed(7), seed=3, num_priorities=levels)
    specs = workload.requests(ByteTokenizer())
    assert specs == workload.requests(_Sequential())
    # the reference: each request's attributes drawn in turn, from the workload's four streams
    arrivals, lengths, tokens, priorities = (random.Random(f"3/{k}") for k in range(4))
    t, reference = 0.0, []
    for i in range(300):
        t += Poisson(4.0).gap(arrivals)
        n_in = Uniform(1, 90).sample(lengths)
        prompt = ByteTokenizer().random_token_ids(n_in, tokens)
        reference.append(RequestSpec(f"req-{i:06d}", t, prompt, Fixed(7).sample(lengths), priorities.randrange(levels)))
    assert specs == reference
