"""Shapes and values that break GPU kernels, on every kernel the CPU layer (and a GPU) runs.

Each test aims at one class of kernel bug that random inputs of friendly sizes do not reach
(issue 36): logits in the hundreds, with a later decode partition far above partition 0
(softmax without max subtraction, a reduce that rescales by the wrong maximum); ties inside one
thread's range of an argmax row; a partial last thread block or warp in every element-wise and
row kernel (a missing tail guard), with outputs that are views at the start of a larger NaN
buffer so a write past their end shows; context lengths that are exact multiples of the block,
tile and partition sizes; a KV cache of more than 2^31 elements (mapped lazily, never touched
but for the request's blocks at its top) for int32 offset overflow; and attention rows checked
with tolerances scaled to each row's own magnitude (``assert_rows_close``), tight enough that
p·V accumulated in fp16/bf16 instead of float32 fails.
"""

from __future__ import annotations

import mmap

import pytest
import torch

from forge.kernels.base import AttentionMetadata
from tests.test_cuda_kernels import (
    DEVICE_PARAMS,
    DTYPES,
    TOL,
    Device,
    assert_close,
    assert_rows_close,
    attention_case,
    check_attention,
    device_for,
    full,
    poisoned,
)

HEAD_DIM = 64


@pytest.fixture(scope="module", params=DEVICE_PARAMS)
def dev(request: pytest.FixtureRequest) -> Device:
    return device_for(request.param)


def tail_checked(shape: tuple[int, ...], dtype: torch.dtype, spare: int = 67) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN buffer and a contiguous view of ``shape`` at its start: the ``spare`` elements after
    the view must still be NaN after a launch (nothing written past the output's end)."""
    n = 1
    for s in shape:
        n *= s
    buf = poisoned((n + spare,), dtype, "cpu")
    return buf, buf[:n].view(shape)


def assert_tail_untouched(buf: torch.Tensor, view: torch.Tensor) -> None:
    tail = buf[view.numel() :]
    assert tail.isnan().all(), f"{int((~tail.isnan()).sum())} elements written past the output's end"


# -- logits in the hundreds ------------------------------------------------------------------------
def large_logit_case(dtype: torch.dtype, device: str, block_size: int = 16):
    """Decode rows over 4 partitions and prefill rows whose logits reach the hundreds: per KV
    head every query head points along one direction u; the key at position 10 scores about
    100 and the key at position 1100 (partition 2) about 400, so exp of an unshifted logit or
    of partition 2's max minus partition 0's overflows float32."""
    query_lens = [1, 1, 6]
    seq_lens = [1543, 700, 1106]
    query, k_cache, v_cache, meta = attention_case(
        dtype, block_size, 2, 4, HEAD_DIM, query_lens, seq_lens, seed=5, device=device
    )
    gen = torch.Generator(device=device).manual_seed(9)
    tables = meta.block_tables
    for seq, length in enumerate(seq_lens):
        begin = sum(query_lens[:seq])
        for kv_head in range(2):
            u = torch.randn(HEAD_DIM, generator=gen, device=device)
            u = u / u.norm()
            heads = slice(kv_head * 4, kv_head * 4 + 4)
            noise = 0.1 * torch.randn(query_lens[seq], 4, HEAD_DIM, generator=gen, device=device)
            query[begin : begin + query_lens[seq], heads] = (16 * u + noise).to(dtype)
            for pos, logit in ((10, 100.0), (1100, 400.0), (length - 1, -300.0)):
                if pos < length:
                    block, offset = int(tables[seq, pos // block_size]), pos % block_size
                    k_cache[block, offset, kv_head] = (logit / 2 * u).to(dtype)  # q·k / 8 with |q| = 16
    return query, k_cache, v_cache, meta


def check_large_logits(dev: Device, dtype: torch.dtype) -> None:
    check_attention(dev, dtype, *large_logit_case(dtype, dev.name))


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_with_logits_in_the_hundreds(dev: Device, dtype: torch.dtype) -> None:
    check_large_logits(dev, dtype)


# -- argmax ties inside one thread ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_ties_inside_one_threads_range(dev: Device, dtype: torch.dtype) -> None:
    check_argmax_ties(dev, dtype)


def check_argmax_ties(dev: Device, dtype: torch.dtype) -> None:
    """vocab 5000 runs 1024 threads, so indices i, i + 1024, i + 2048 are one thread's."""
    vocab = 5000
    logits = torch.randn(6, vocab).to(dtype)
    logits[0, [7, 7 + 1024, 7 + 2048]] = 50.0  # one thread sees the tie three times
    logits[1, [1030 + 2048, 1030, 3000]] = 50.0  # the thread's later index is written first
    logits[2, vocab - 1] = 50.0  # the only maximum in the last, partial pass
    logits[3, [2000, 2000 + 1024]] = float("nan")  # the first NaN wins
    logits[4] = 0.0  # every entry ties: index 0
    logits[5, [4999, 3975, 0]] = 50.0  # thread 903's two and thread 0's: index 0
    out = torch.full((6,), -1, dtype=torch.int64)
    dev.cuda.ops.argmax(out, logits.to(dev.name))
    assert out.tolist() == [7, 1030, vocab - 1, 2000, 0, 0]


@pytest.mark.parametrize("vocab", [33, 1025])
def test_argmax_in_a_partial_warp(dev: Device, vocab: int) -> None:
    logits = torch.randn(3, vocab)
    logits[1, vocab - 1] = 9.0
    logits[2, [vocab - 1, vocab - 2]] = 9.0
    out = torch.full((3,), -1, dtype=torch.int64)
    dev.cuda.ops.argmax(out, logits.to(dev.name))
    assert torch.equal(out.cpu(), logits.argmax(-1))


# -- partial last blocks ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_partial_last_block(dev: Device, dtype: torch.dtype) -> None:
    check_silu_mul_tail(dev, dtype)


def check_silu_mul_tail(dev: Device, dtype: torch.dtype) -> None:
    tokens, inter = 3, 300  # 900 elements: 3 blocks of 256 and 132 in the last
    gate_up = 3 * torch.randn(tokens, 2 * inter, dtype=dtype)
    buf, out = tail_checked((tokens, inter), dtype, spare=300)  # the last block reaches 124 past the end
    dev.cuda.ops.silu_mul(out, gate_up)
    assert_tail_untouched(buf, out)
    assert_close(out, dev.oracle.silu_mul(gate_up.float()), dtype, scale=3.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_partial_warp(dev: Device, dtype: torch.dtype) -> None:
    rows, hidden = 3, 100  # 32 threads over 100 columns: the last pass has 4 of them busy
    x = torch.randn(rows, hidden, dtype=dtype)
    r = torch.randn(rows, hidden, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden)).to(dtype)
    buf, out = tail_checked((rows, hidden), dtype)
    dev.cuda.ops.rms_norm(out, x, w, 1e-5)
    assert_tail_untouched(buf, out)
    assert_close(out, dev.oracle.rms_norm(x.float(), w.float(), 1e-5), dtype)
    (buf, out), (rbuf, res_out) = tail_checked((rows, hidden), dtype), tail_checked((rows, hidden), dtype)
    dev.cuda.ops.add_rms_norm(out, res_out, x, r, w, 1e-5)
    assert_tail_untouched(buf, out)
    assert_tail_untouched(rbuf, res_out)
    assert torch.equal(res_out, x + r)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope_partial_block(dev: Device, dtype: torch.dtype) -> None:
    check_rope_tail(dev, dtype)


def check_rope_tail(dev: Device, dtype: torch.dtype) -> None:
    from forge.models.decoder import rope_cos_sin
    from forge.models.llama import LlamaConfig

    heads, kv_heads, head_dim, tokens = 3, 1, 20, 5  # 40 pairs: 64 threads, 24 idle
    cfg = LlamaConfig(8, heads * head_dim, 8, 1, heads, kv_heads, max_position=64)
    cos_sin = rope_cos_sin(cfg, torch.float32, torch.device("cpu"))
    q = torch.randn(tokens, heads, head_dim, dtype=dtype)
    k = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)
    positions = torch.randint(0, 64, (tokens,))
    (qbuf, q_out), (kbuf, k_out) = tail_checked(q.shape, dtype), tail_checked(k.shape, dtype)
    dev.cuda.ops.rope_neox(q_out, k_out, q, k, positions, cos_sin)
    assert_tail_untouched(qbuf, q_out)
    assert_tail_untouched(kbuf, k_out)
    eq, ek = dev.oracle.rope(q.float(), k.float(), positions, cos_sin.to(dtype).float())
    assert_close(q_out, eq, dtype)
    assert_close(k_out, ek, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_write_partial_block(dev: Device, dtype: torch.dtype) -> None:
    check_cache_write_tail(dev, dtype)


def check_cache_write_tail(dev: Device, dtype: torch.dtype) -> None:
    """Rows of 60 elements (64 threads), the cache's last slot, and slot -1 (graph padding: skipped)."""
    num_blocks, block_size, kv_heads, head_dim, tokens = 4, 8, 3, 20, 9  # rows of 60: 64 threads
    key = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)
    value = torch.randn(tokens, kv_heads, head_dim, dtype=dtype)
    slots = torch.randperm(num_blocks * block_size - 1)[:tokens]
    slots[0] = num_blocks * block_size - 1  # the cache's last slot
    slots[1] = -1
    shape = (num_blocks, block_size, kv_heads, head_dim)
    (kbuf, k_cache), (vbuf, v_cache) = tail_checked(shape, dtype), tail_checked(shape, dtype)
    dev.cuda.write_kv((k_cache, v_cache), key, value, slots)
    assert_tail_untouched(kbuf, k_cache)
    assert_tail_untouched(vbuf, v_cache)
    keep = slots >= 0
    assert torch.equal(k_cache.view(-1, kv_heads, head_dim)[slots[keep]], key[keep])
    assert int((~k_cache.isnan()).sum()) == int(keep.sum()) * kv_heads * head_dim


@pytest.mark.parametrize("kind", ["q8_0", full("q4_k")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequant_and_gemv_partial_last_block(dev: Device, kind: str, dtype: torch.dtype) -> None:
    check_quant_tail(dev, kind, dtype)


def check_quant_tail(dev: Device, kind: str, dtype: torch.dtype) -> None:
    """q8_0 37 x 64 = 2368 weights: 9 blocks of 256 and 64 in the last; q4_k totals are multiples
    of 256, so its partial unit is the GEMV's last block (5 features over 4 warps)."""
    from forge.kernels.cuda.quant import dequantize_reference, dequantize_rows, quantize_q8_0, random_q4_k

    gen = torch.Generator().manual_seed(3)
    w = quantize_q8_0(torch.randn(64, 37, generator=gen)) if kind == "q8_0" else random_q4_k(256, 5, gen)
    buf, out = tail_checked((w.out_features, w.in_features), dtype)
    dev.cuda.ops.dequantize(out, w)
    assert_tail_untouched(buf, out)
    torch.testing.assert_close(out.float(), dequantize_rows(w).to(dtype).float(), atol=1e-6, rtol=TOL[dtype] / 2)
    x = torch.randn(3, w.in_features, dtype=dtype)
    ybuf, y = tail_checked((3, w.out_features), dtype)
    dev.cuda.ops.gemv(y, x, w)
    assert_tail_untouched(ybuf, y)
    expected = x.float() @ dequantize_reference(w)
    scale = expected.abs().max().item()
    assert_close(y / scale, expected / scale, dtype)


# -- exact multiples of block, tile and partition sizes -----------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [16, full(32)])
def test_attention_lengths_that_are_exact_multiples(dev: Device, dtype: torch.dtype, block_size: int) -> None:
    """Decode contexts of 1, 2 and 3 whole partitions (512) and one whole block; prefill chunks of
    whole 32-key tiles and whole thread blocks of tokens (8 per block at GQA 4)."""
    query_lens = [1, 1, 1, 1, 32, 64, 8]
    seq_lens = [block_size, 512, 1024, 1536, 64, 512, 32]
    case = attention_case(dtype, block_size, 2, 4, HEAD_DIM, query_lens, seq_lens, seed=block_size, device=dev.name)
    check_attention(dev, dtype, *case)


@pytest.mark.parametrize("window", [512, 32])
def test_sliding_window_of_exact_multiples(dev: Device, window: int) -> None:
    query_lens = [1, 1, 64]
    seq_lens = [1024, 1536, 544]
    case = attention_case(torch.float32, 16, 2, 4, HEAD_DIM, query_lens, seq_lens, seed=window, device=dev.name)
    check_attention(dev, torch.float32, *case, window=window)


# -- a KV cache over 2^31 elements ---------------------------------------------------------------------
def lazy_cache(num_blocks: int, block_size: int, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised cache in an anonymous MAP_NORESERVE mapping: pages cost memory only once
    touched, so a cache of several GiB holds only what a test writes (the rest reads 0)."""
    elements = num_blocks * block_size * kv_heads * HEAD_DIM
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0)
    memory = mmap.mmap(-1, elements * dtype.itemsize, flags=flags)
    return torch.frombuffer(memory, dtype=dtype).view(num_blocks, block_size, kv_heads, HEAD_DIM)


def test_kv_cache_over_2_to_the_31_elements(dev: Device) -> None:
    if dev.name != "cpu":
        pytest.skip("the 8 GiB cache is mapped lazily on the CPU only")
    check_cache_over_2_to_the_31(dev)


def check_cache_over_2_to_the_31(dev: Device) -> None:
    """Blocks at the top of a cache of 2^31 + 2^14 elements per layer (4 GiB of fp16): the write
    kernel puts a decode and a prefill request's context there and both attention kernels read it
    back; offsets computed in int32 wrap and miss. The oracle sees the same blocks compacted."""
    dtype, block_size, kv_heads = torch.float16, 16, 2
    num_blocks = 2**20 + 8
    assert num_blocks * block_size * kv_heads * HEAD_DIM > 2**31
    caches = (lazy_cache(num_blocks, block_size, kv_heads, dtype), lazy_cache(num_blocks, block_size, kv_heads, dtype))
    query_lens, seq_lens = [1, 20], [60, 50]
    top = [list(range(num_blocks - 4, num_blocks)), list(range(num_blocks - 8, num_blocks - 4))]
    tables = torch.tensor(top, dtype=torch.long)
    positions = [torch.arange(n) for n in seq_lens]
    slots = torch.cat([tables[i, p // block_size] * block_size + p % block_size for i, p in enumerate(positions)])
    key = torch.randn(slots.numel(), kv_heads, HEAD_DIM).to(dtype)
    value = torch.randn(slots.numel(), kv_heads, HEAD_DIM).to(dtype)
    dev.cuda.write_kv(caches, key, value, slots)
    used = tables.flatten()
    assert torch.equal(caches[0][used].reshape(-1, kv_heads, HEAD_DIM)[: seq_lens[0]], key[: seq_lens[0]])
    query = torch.randn(sum(query_lens), kv_heads * 4, HEAD_DIM).to(dtype)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor([0, 1, 21]),
        seq_lens=torch.tensor(seq_lens),
        block_tables=tables,
        slot_mapping=torch.zeros(21, dtype=torch.long),
        block_size=block_size,
        query_lens_cpu=query_lens,
        seq_lens_cpu=seq_lens,
    )
    out = poisoned(query.shape, dtype, "cpu")
    dev.cuda.ops.attention(out, query, *caches, dev.cuda._device_meta(meta), HEAD_DIM**-0.5)
    compact = (caches[0][used].float(), caches[1][used].float())
    small = AttentionMetadata(
        meta.query_start_loc,
        meta.seq_lens,
        torch.arange(8).view(2, 4),
        meta.slot_mapping,
        block_size,
        query_lens,
        seq_lens,
    )
    assert_rows_close(out, dev.oracle.attention(query.float(), compact, small, HEAD_DIM**-0.5), dtype)
