"""The synthetic model's C decode chain (forge/kernels/cpu/synthetic.c) gives the Python chain's tokens
and KV writes, bit for bit: Python's own hash of ints and tuples, every context (padding before the
sequence, contexts across blocks, both gate outcomes), any order, block size and seed."""

from __future__ import annotations

import random
from array import array

import numpy as np
import pytest

from forge.core.decode_run import DecodeRun
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.kernels.cpu import synthetic as chain
from forge.kernels.cpu.build import NativeKernelsUnavailable, compiler
from forge.models.synthetic import SyntheticModel


def has_compiler() -> bool:
    try:
        compiler()
    except NativeKernelsUnavailable:
        return False
    return True


pytestmark = pytest.mark.skipif(not has_compiler(), reason="no C compiler here: the Python chain runs")


def test_the_chain_loads_where_a_compiler_is() -> None:
    assert chain.library() is not None  # None also when its hash differs from this Python's


def test_tuple_hash_is_pythons() -> None:
    lib = chain.library()
    assert lib is not None
    rng = random.Random(0)
    for n in range(0, 9):
        for _ in range(200):
            values = tuple(
                rng.choice([-1, -2, 0, rng.randrange(-(2**63), 2**63), rng.randrange(300)]) for _ in range(n)
            )
            array = np.array(values, dtype=np.int64)
            assert lib.forge_synthetic_tuple_hash(array.ctypes.data, n) == hash(values)


@pytest.mark.parametrize(("order", "block_size", "seed", "repetitiveness"), [
    (1, 1, 0, 0.5), (2, 4, 1, 0.0), (3, 16, 0, 0.5), (3, 16, -1, 1.0), (5, 4, 2**40, 0.5), (8, 16, 7, 0.3),
])  # fmt: skip
def test_c_chain_equals_python_chain(order: int, block_size: int, seed: int, repetitiveness: float) -> None:
    rng = random.Random(order * 31 + block_size)
    num_blocks = 64
    slots = num_blocks * block_size
    rows = 6
    tables = [rng.sample(range(num_blocks), num_blocks // rows) for _ in range(rows)]
    capacity = len(tables[0]) * block_size
    starts = [rng.randrange(0, capacity // 2) for _ in range(rows)]
    starts[0] = 0  # a context before the sequence: padding
    steps = [rng.randrange(1, capacity - s) for s in starts]
    cache = np.array([rng.randrange(32, 127) for _ in range(slots)], dtype=np.int64)
    twins = [Request(f"r{i}", [1], SamplingParams(max_tokens=1)) for i in range(rows)]
    run = DecodeRun(twins, starts, [rng.randrange(32, 127) for _ in range(rows)], tables, steps, [True] * rows)
    bs = block_size
    results = []
    for native in (True, False):
        model = SyntheticModel(seed=seed, order=order, repetitiveness=repetitiveness, native=native)
        cache_copy = cache.copy()
        layer = (cache_copy, cache_copy.copy())
        results.append((model.forward_host_run(run, bs, [layer]), layer[0], layer[1]))
    (fast, k1, v1), (slow, k2, v2) = results
    assert fast == slow and sum(map(len, fast)) == sum(steps)
    assert np.array_equal(k1, k2) and np.array_equal(v1, v2) and np.array_equal(k1, v1)


def test_a_seed_beyond_int64_runs_the_python_chain() -> None:
    assert chain.decode_rows((0, 0, 0), 16, 3, 2**64, 0, 32, 95, ([0], [40], [1], [[0]])) is None


def test_a_block_outside_the_cache_is_refused() -> None:
    cache = array("q", bytes(8 * 64))
    kv = (cache.buffer_info()[0], cache.buffer_info()[0], 64)
    assert chain.decode_rows(kv, 16, 3, 0, 0, 32, 95, ([0], [40], [3], [[3]])) is not None  # slots 48..50
    for table in ([4], [-1]):
        with pytest.raises(ValueError, match="outside the cache"):
            chain.decode_rows(kv, 16, 3, 0, 0, 32, 95, ([0], [40], [3], [table]))
    with pytest.raises(ValueError, match="outside its block table"):
        chain.decode_rows(kv, 16, 3, 0, 0, 32, 95, ([14], [40], [3], [[0]]))


def test_a_row_of_no_steps_reads_and_writes_nothing() -> None:
    cache = array("q", bytes(8 * 64))
    kv = (cache.buffer_info()[0], cache.buffer_info()[0], 64)
    for start in (0, 40, 1600, 10**6):  # positions far outside the one-block table: nothing is read
        assert chain.decode_rows(kv, 16, 3, 0, 0, 32, 95, ([start], [40], [0], [[0]])) == [[]]
    assert not any(cache)


def test_a_chunk_outside_the_cache_or_its_table_is_refused() -> None:
    cache = array("q", bytes(8 * 64))
    kv = (cache.buffer_info()[0], cache.buffer_info()[0], 64)
    assert chain.write_tokens(kv, 16, 2, [40, 41], [3]) and cache[50:52].tolist() == [40, 41]
    with pytest.raises(ValueError, match="outside the cache"):
        chain.write_tokens(kv, 16, 0, [40], [4])
    with pytest.raises(ValueError, match="outside its block table"):
        chain.write_tokens(kv, 16, 15, [40, 41], [0])


def test_a_chunk_token_that_is_no_int64_is_refused_and_minus_one_is_written() -> None:
    cache = array("q", bytes(8 * 64))
    kv = (cache.buffer_info()[0], cache.buffer_info()[0], 64)
    assert chain.write_tokens(kv, 16, 0, [40, -1], [0]) and cache[:2].tolist() == [40, -1]
    with pytest.raises(TypeError):
        chain.write_tokens(kv, 16, 0, [40, "x"], [0])  # type: ignore[list-item]
    with pytest.raises(OverflowError):
        chain.write_tokens(kv, 16, 0, [40, 2**70], [0])
