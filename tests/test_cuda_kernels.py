"""Every CUDA kernel against the TorchBackend oracle: on a GPU, and on the CPU layer everywhere.

Each test runs on two devices: ``cuda`` (a GPU with CuPy; marked ``gpu``, skipped elsewhere)
and ``cpu-layer``, where ``forge.kernels.cuda.cpu_emu`` compiles the same ``.cu`` sources as
C++ under CUDA's execution model (threads as fibers, 32-lane warps, barriers, NaN-filled
shared memory with a guard page, launch checks) and forge's own ``CudaOps`` / ``CudaBackend``
/ ``GraphRunner`` drive them. CI runs a representative subset on the CPU layer (every kernel
in every dtype, a few shapes); the other shapes are marked ``slow`` (``pytest -m slow`` runs
them on the CPU layer, ``pytest -m gpu`` everything on a GPU).

Inputs are fresh random tensors in the dtype under test. The oracle is TorchBackend run on
float32 copies of those same inputs, so it sees exactly the kernel's inputs and carries no
rounding of its own beyond float32. Outputs are poisoned with NaN before each launch (the
ops take caller-allocated outputs), and KV-cache slots outside every request's context are
NaN too, so an element a kernel fails to write, or a key it reads past a context's end,
shows up as NaN.

Tolerances (``TOL``): the kernels read dtype inputs, compute in float32 and round the
result to the dtype once; where TorchBackend rounds an intermediate in the dtype (the
residual sum, silu before the product, cos/sin cast to the activation dtype) they round
the same intermediate. So against the float32 oracle the error is a few units in the last
place of the output dtype for O(1) values: bfloat16 has 8 significant bits (ulp 2^-7 at 1),
so 2 ulps = 1.6e-2; float16 has 11 (ulp 2^-10), so 2e-3 leaves 2 ulps; float32 differs only
in summation order over at most a few thousand terms: 1e-4 (attention, GEMV) covers it.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from forge.engine.runner import ModelRunner
from forge.kernels.base import AttentionMetadata
from forge.kernels.cuda.compiler import missing_requirements
from forge.kernels.cuda_backend import CudaBackend
from forge.kernels.torch_backend import TorchBackend

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
FULL = pytest.mark.slow  # the full matrix: not on every CI run


def full(*values: Any) -> Any:
    return pytest.param(*values, marks=FULL)


@dataclass
class Device:
    name: str  # "cpu" for the CPU layer, "cuda" for a GPU
    cuda: CudaBackend
    oracle: TorchBackend
    runtime: Any  # the CPU layer (a CpuCuda) or None

    def backend(self, cuda_graphs: bool) -> CudaBackend:
        return CudaBackend(self.name, cuda_graphs=cuda_graphs, runtime=self.runtime)


DEVICE_PARAMS = [
    pytest.param("cpu", id="cpu-layer"),
    pytest.param(
        "cuda",
        id="cuda",
        marks=[pytest.mark.gpu, pytest.mark.skipif(bool(missing_requirements()), reason="needs a GPU and CuPy")],
    ),
]


def device_for(name: str) -> Device:
    """The CUDA backend on ``name`` ("cpu": the CPU layer, "cuda": a GPU) and its TorchBackend oracle."""
    runtime = None
    if name == "cpu":
        from forge.kernels.cuda.cpu_emu import CpuCuda

        runtime = CpuCuda()
    cuda = CudaBackend(name, cuda_graphs=False, runtime=runtime)
    return Device(name, cuda, TorchBackend(name), runtime)


@pytest.fixture(scope="module", params=DEVICE_PARAMS)
def dev(request: pytest.FixtureRequest) -> Device:
    return device_for(request.param)


def poisoned(shape: tuple[int, ...], dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> None:
    assert not actual.isnan().any(), "NaN in output: an element was not written or read poison"
    tol = TOL[dtype] * scale
    torch.testing.assert_close(actual.float(), expected.float(), atol=tol, rtol=tol)


# -- element-wise and row kernels ---------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [full(1, 64), (7, 576), full(33, 1000), full(4, 4096)])
def test_rms_norm(dev: Device, dtype: torch.dtype, rows: int, hidden: int) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    out = poisoned((rows, hidden), dtype, device)
    cuda.ops.rms_norm(out, x, w, 1e-5)
    assert_close(out, oracle.rms_norm(x.float(), w.float(), 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,hidden", [full(1, 64), (9, 576), full(40, 2048)])
def test_add_rms_norm(dev: Device, dtype: torch.dtype, rows: int, hidden: int) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    x = torch.randn(rows, 2 * hidden, device=device, dtype=dtype)[:, :hidden]  # strided rows
    r = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(hidden, device=device)).to(dtype)
    out, res_out = poisoned((rows, hidden), dtype, device), poisoned((rows, hidden), dtype, device)
    cuda.ops.add_rms_norm(out, res_out, x, r, w, 1e-6)
    # The residual sum is one rounding of the exact sum, as torch's add: bit-identical.
    assert torch.equal(res_out, x + r)
    expected, _ = oracle.add_rms_norm(x.float(), r.float(), w.float(), 1e-6)
    assert_close(out, oracle.rms_norm((x + r).float(), w.float(), 1e-6), dtype)
    assert_close(out, expected, dtype, scale=2.0)  # also within 2x of the unrounded-residual oracle


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim", [full(4, 2, 16), (9, 3, 64), full(32, 8, 128)])
def test_rope(dev: Device, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    from forge.models.decoder import rope_cos_sin
    from forge.models.llama import LlamaConfig

    tokens = 37
    cfg = LlamaConfig(
        vocab_size=8,
        hidden_size=heads * head_dim,
        intermediate_size=8,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv_heads,
        max_position=4096,
    )
    cos_sin = rope_cos_sin(cfg, torch.float32, torch.device(device))
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, device=device, dtype=dtype)
    q = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)  # strided views, as the model passes
    k = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    positions = torch.randint(0, 4096, (tokens,), device=device)
    q_out, k_out = poisoned(q.shape, dtype, device), poisoned(k.shape, dtype, device)
    cuda.ops.rope_neox(q_out, k_out, q, k, positions, cos_sin)
    # The reference casts cos/sin to the activation dtype; give the oracle the same values.
    cs = cos_sin.to(dtype).float()
    eq, ek = oracle.rope(q.float(), k.float(), positions, cs)
    assert_close(q_out, eq, dtype)
    assert_close(k_out, ek, dtype)
    # And the backend op against TorchBackend in the dtype itself.
    bq, bk = cuda.rope(q, k, positions, cos_sin)
    rq, rk = oracle.rope(q, k, positions, cos_sin)
    assert_close(bq, rq, dtype, scale=2.0)
    assert_close(bk, rk, dtype, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,inter", [full(1, 64), (13, 1536), full(300, 160)])
def test_silu_mul(dev: Device, dtype: torch.dtype, tokens: int, inter: int) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    gate_up = 3 * torch.randn(tokens, 2 * inter, device=device, dtype=dtype)
    out = poisoned((tokens, inter), dtype, device)
    cuda.ops.silu_mul(out, gate_up)
    assert_close(out, oracle.silu_mul(gate_up.float()), dtype, scale=3.0)  # values up to ~10
    assert_close(cuda.silu_mul(gate_up), oracle.silu_mul(gate_up), dtype, scale=3.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,vocab", [full(1, 5), (3, 320), full(64, 49152), (2, 128_257)])
def test_argmax(dev: Device, dtype: torch.dtype, rows: int, vocab: int) -> None:
    cuda, device = dev.cuda, dev.name
    logits = torch.randn(rows, vocab, device=device).to(dtype)
    logits[0, vocab // 3] = logits[0, vocab - 1] = 100.0  # a tie: the first index wins
    out = torch.full((rows,), -1, dtype=torch.int64, device=device)
    cuda.ops.argmax(out, logits)
    assert torch.equal(out, logits.argmax(dim=-1))
    assert out[0].item() == vocab // 3
    assert torch.equal(cuda.argmax(logits), logits.argmax(dim=-1))


# -- KV cache write --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [full(8), 16, full(32)])
def test_reshape_and_cache(dev: Device, dtype: torch.dtype, block_size: int) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    num_blocks, kv_heads, head_dim, tokens = 12, 3, 64, 50
    qkv = torch.randn(tokens, 5 * kv_heads * head_dim, device=device, dtype=dtype)
    key = qkv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    value = qkv[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    slots[3] = -1  # graph padding: skipped
    caches = [poisoned((num_blocks, block_size, kv_heads, head_dim), dtype, device) for _ in range(2)]
    cuda.write_kv((caches[0], caches[1]), key, value, slots)
    keep = slots >= 0
    expected = [poisoned(caches[0].shape, dtype, device) for _ in range(2)]
    oracle.write_kv((expected[0], expected[1]), key[keep], value[keep], slots[keep])
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got.isnan(), want.isnan())  # nothing else written
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


# -- attention ---------------------------------------------------------------------------------
# (block_size, query heads per KV head): CI runs (16, 4); the others are the full matrix.
ATTENTION_LAYOUTS = [(16, 4), *(full(b, g) for b in (8, 16, 32) for g in (1, 2, 4, 8) if (b, g) != (16, 4))]


def attention_case(
    dtype: torch.dtype,
    block_size: int,
    kv_heads: int,
    gqa: int,
    head_dim: int,
    query_lens: list[int],
    seq_lens: list[int],
    seed: int,
    device: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, AttentionMetadata]:
    """Query, NaN-poisoned paged caches holding each request's context in shuffled blocks,
    and metadata. Block 0 is never allocated and stays NaN; block tables pad with it."""
    gen = torch.Generator(device=device).manual_seed(seed)
    rng = random.Random(seed)
    heads = kv_heads * gqa
    blocks_per_seq = [math.ceil(s / block_size) for s in seq_lens]
    num_blocks = 1 + sum(blocks_per_seq) + 3
    k_cache = poisoned((num_blocks, block_size, kv_heads, head_dim), dtype, device)
    v_cache = poisoned((num_blocks, block_size, kv_heads, head_dim), dtype, device)
    free = list(range(1, num_blocks))
    rng.shuffle(free)
    width = max(blocks_per_seq) + 2
    tables = torch.zeros(len(seq_lens), width, dtype=torch.long)
    for i, (n, length) in enumerate(zip(blocks_per_seq, seq_lens, strict=True)):
        blocks = torch.tensor([free.pop() for _ in range(n)])
        tables[i, :n] = blocks
        p = torch.arange(length)
        slots = (blocks[p // block_size] * block_size + p % block_size).to(device)
        for cache in (k_cache, v_cache):
            values = torch.randn(length, kv_heads, head_dim, generator=gen, device=device).to(dtype)
            cache.view(-1, kv_heads, head_dim)[slots] = values
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    query = torch.randn(starts[-1], heads, head_dim, generator=gen, device=device).to(dtype)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, device=device),
        seq_lens=torch.tensor(seq_lens, device=device),
        block_tables=tables.to(device),
        slot_mapping=torch.zeros(starts[-1], dtype=torch.long, device=device),  # unused here
        block_size=block_size,
        query_lens_cpu=list(query_lens),
        seq_lens_cpu=list(seq_lens),
    )
    return query, k_cache, v_cache, meta


# Attention rows are weighted means of V rows: their magnitude falls with the context length (a
# 2,000-key row has an RMS near 0.02), so one absolute tolerance is loose for long rows. Each element
# is held to REL * (|expected| + the RMS of its row): the kernel rounds a float32 result once (at
# most half an ulp, 2^-11 / 2^-8 relative for fp16 / bf16) and differs from the float32 oracle in
# summation order; measured worst case 0.37 of this bound (fp16, bf16) and 17 * 2^-23 (float32).
# p·V accumulated in the dtype instead of float32 exceeds it.
REL = {torch.float32: 2.0**-17, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}


def assert_rows_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    """``[tokens, heads, head_dim]`` outputs, each row against its own magnitude (see REL)."""
    assert not actual.isnan().any(), "NaN in output: an element was not written or read poison"
    expected = expected.float()
    err = (actual.float() - expected).abs()
    rms = expected.pow(2).mean(-1, keepdim=True).sqrt()
    bound = REL[dtype] * (expected.abs() + rms)
    worst = int((err / bound).flatten().argmax())
    token, rest = divmod(worst, expected.shape[1] * expected.shape[2])
    head, dim = divmod(rest, expected.shape[2])
    assert (err <= bound).all(), (
        f"{int((err > bound).sum())} elements off; worst: token {token} head {head} dim {dim}: "
        f"{actual[token, head, dim].item()} vs {expected[token, head, dim].item()} "
        f"(row RMS {rms[token, head, 0].item():.3g}, bound {bound[token, head, dim].item():.3g})"
    )


def check_attention(dev: Device, dtype, query, k_cache, v_cache, meta, window=None) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    head_dim = query.shape[-1]
    scale = head_dim**-0.5
    out = poisoned(query.shape, dtype, device)
    cuda.ops.attention(out, query, k_cache, v_cache, cuda._device_meta(meta), scale, window)
    # The oracle's batched decode gathers padded positions too (0 * NaN would poison it):
    # it gets the same caches with the poison zeroed, the kernel the poisoned ones.
    kv32 = (k_cache.float().nan_to_num(), v_cache.float().nan_to_num())
    expected = oracle.attention(query.float(), kv32, meta, scale, window)
    assert_rows_close(out, expected, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,gqa", ATTENTION_LAYOUTS)
def test_decode_attention(dev: Device, dtype, block_size, gqa) -> None:
    device = dev.name
    # Lengths: 1, non-multiples of every block size, exactly one partition (512), and long
    # contexts that span 2..5 partitions of 512 and need the reduce kernel.
    seq_lens = [1, 7, 33, 512, 513, 1000, 1537, 2100]
    case = attention_case(
        dtype, block_size, 2, gqa, 64, [1] * len(seq_lens), seq_lens, seed=gqa * 100 + block_size, device=device
    )
    check_attention(dev, dtype, *case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim,kv_heads,gqa", [full(16, 2, 2), full(64, 3, 3), full(128, 8, 4), full(256, 1, 8)])
def test_decode_attention_head_shapes(dev: Device, dtype, head_dim, kv_heads, gqa) -> None:
    device = dev.name
    seq_lens = [5, 16, 700, 1025]
    case = attention_case(dtype, 16, kv_heads, gqa, head_dim, [1] * 4, seq_lens, seed=head_dim, device=device)
    check_attention(dev, dtype, *case)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size,gqa", ATTENTION_LAYOUTS)
def test_prefill_attention_with_cached_prefix(dev: Device, dtype, block_size, gqa) -> None:
    device = dev.name
    # Full prefills, chunks after a cached prefix (query_len < seq_len), a 2-token chunk, and
    # decode requests mixed in: both kernels in one step, every output row written once.
    query_lens = [37, 1, 100, 2, 1, 300, 5]
    seq_lens = [37, 90, 613, 50, 1100, 300, 1029]
    case = attention_case(
        dtype, block_size, 2, gqa, 64, query_lens, seq_lens, seed=gqa * 10 + block_size, device=device
    )
    check_attention(dev, dtype, *case)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim,kv_heads,gqa", [full(16, 2, 2), full(128, 8, 4), full(256, 2, 8)])
def test_prefill_attention_head_shapes(dev: Device, dtype, head_dim, kv_heads, gqa) -> None:
    device = dev.name
    case = attention_case(dtype, 16, kv_heads, gqa, head_dim, [70, 9], [70, 200], seed=head_dim + gqa, device=device)
    check_attention(dev, dtype, *case)


@pytest.mark.parametrize(
    "dtype,window",
    [
        (torch.float32, 1),
        *((d, 37) for d in DTYPES),
        (torch.float32, 600),  # a window over two decode partitions that start mid-context
        *(full(d, w) for d in (torch.float16, torch.bfloat16) for w in (1, 600)),
        *(full(d, 100) for d in DTYPES),
    ],
)
def test_sliding_window_attention(dev: Device, dtype: torch.dtype, window: int) -> None:
    """Sliding-window attention (Gemma-3's local layers): decode rows and prefill chunks over a
    cached prefix, windows shorter and longer than chunks, contexts and a partition."""
    query_lens = [37, 1, 100, 2, 1, 300, 5]
    seq_lens = [37, 90, 613, 50, 1100, 300, 1029]
    case = attention_case(dtype, 16, 2, 4, 64, query_lens, seq_lens, seed=window, device=dev.name)
    check_attention(dev, dtype, *case, window=window)


def test_backend_attention_matches_torch_backend_in_dtype(dev: Device) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    dtype = torch.bfloat16
    query, k_cache, v_cache, meta = attention_case(
        dtype, 16, 3, 3, 64, [1, 40, 1], [600, 40, 17], seed=7, device=device
    )
    got = cuda.attention(query, (k_cache, v_cache), meta, 0.125)
    want = oracle.attention(query, (k_cache.nan_to_num(), v_cache.nan_to_num()), meta, 0.125)
    # TorchBackend rounds its scores and probabilities to bf16; the kernel keeps float32.
    assert_close(got, want, dtype, scale=2.0)


# -- quantized KV cache (engine.kv_cache_dtype=int8 / fp8) ------------------------------------
# CI runs int8 under float32 activations (the write, decode and prefill kernels, a window); the
# fp8 formats and the other activation dtypes are the full matrix.
KV_QUANT = [torch.int8, full(torch.float8_e4m3fn), full(torch.float8_e5m2)]
KV_QUANT_IDS = ["int8", "fp8_e4m3", "fp8_e5m2"]


@pytest.mark.parametrize("kv_dtype", KV_QUANT, ids=KV_QUANT_IDS)
@pytest.mark.parametrize("dtype", [torch.float32, full(torch.float16), full(torch.bfloat16)])
def test_reshape_and_cache_quantized(dev: Device, dtype: torch.dtype, kv_dtype: torch.dtype) -> None:
    """The kernel's bytes (values and scales) are TorchBackend's (``kv_quant.quantize``), bit for
    bit, at the written slots, and nothing else is written."""
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    num_blocks, block_size, kv_heads, head_dim, tokens = 12, 16, 3, 64, 50
    qkv = torch.randn(tokens, 5 * kv_heads * head_dim, device=device, dtype=dtype)
    key = qkv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    value = qkv[:, kv_heads * head_dim : 2 * kv_heads * head_dim].view(tokens, kv_heads, head_dim) * 1e-3
    key[7, 1] = 0  # an all-zero row: scale 0
    slots = torch.randperm(num_blocks * block_size, device=device)[:tokens]
    slots[3] = -1  # graph padding: skipped
    shape = (num_blocks, block_size, kv_heads, head_dim + 4)
    caches = [torch.full(shape, 0xA5, dtype=torch.uint8, device=device).view(kv_dtype) for _ in range(2)]
    expected = [c.clone() for c in caches]
    cuda.write_kv((caches[0], caches[1]), key, value, slots)
    keep = slots >= 0
    oracle.write_kv((expected[0], expected[1]), key[keep], value[keep], slots[keep])
    for got, want in zip(caches, expected, strict=True):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def check_quantized_attention(dev: Device, dtype, kv_dtype, query, k_cache, v_cache, meta, window=None) -> None:
    """The kernels over int8/fp8 caches against TorchBackend over their dequantized float32 values.
    Slots outside every context were NaN before quantizing: NaN scales, so a stray read is NaN."""
    from forge.kernels.kv_quant import dequantize, quantize

    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    kq, vq = quantize(k_cache, kv_dtype), quantize(v_cache, kv_dtype)
    scale = query.shape[-1] ** -0.5
    out = poisoned(query.shape, dtype, device)
    cuda.ops.attention(out, query, kq, vq, cuda._device_meta(meta), scale, window)
    dense = (dequantize(kq).nan_to_num(), dequantize(vq).nan_to_num())
    assert_close(out, oracle.attention(query.float(), dense, meta, scale, window), dtype)


@pytest.mark.parametrize("kv_dtype", KV_QUANT, ids=KV_QUANT_IDS)
@pytest.mark.parametrize("dtype,window", [(torch.float32, None), (torch.float32, 37), full(torch.bfloat16, None)])
def test_attention_over_quantized_cache(dev: Device, dtype, kv_dtype, window) -> None:
    """Decode rows (one and several partitions) and prefill chunks over cached prefixes, in one step."""
    query_lens = [37, 1, 100, 2, 1, 300, 5]
    seq_lens = [37, 90, 613, 50, 1100, 300, 1029]
    case = attention_case(dtype, 16, 2, 4, 64, query_lens, seq_lens, seed=11, device=dev.name)
    check_quantized_attention(dev, dtype, kv_dtype, *case, window=window)


# -- quantized weights ------------------------------------------------------------------------
def _quantized(kind: str, in_f: int, out_f: int, seed: int, device: str):
    from forge.kernels.cuda.quant import quantize_q8_0, random_q4_k

    gen = torch.Generator().manual_seed(seed)
    if kind == "q8_0":
        return quantize_q8_0(torch.randn(in_f, out_f, generator=gen) / math.sqrt(in_f)).to(device)
    return random_q4_k(in_f, out_f, gen, scale=1e-3).to(device)


@pytest.mark.parametrize("kind", ["q8_0", "q4_k"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize(dev: Device, kind: str, dtype: torch.dtype) -> None:
    cuda, device = dev.cuda, dev.name
    from forge.kernels.cuda.quant import dequantize_rows

    w = _quantized(kind, 512, 96, seed=1, device=device)
    out = poisoned((w.out_features, w.in_features), dtype, device)
    cuda.ops.dequantize(out, w)
    expected = dequantize_rows(w)  # float32, exact ggml arithmetic
    torch.testing.assert_close(out.float(), expected.to(dtype).float(), atol=1e-6, rtol=TOL[dtype] / 2)
    assert torch.equal(cuda.dequantize_weight(w, dtype), out.t())


@pytest.mark.parametrize("kind", ["q8_0", "q4_k"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [full(1), 3, full(8)])
def test_gemv(dev: Device, kind: str, dtype: torch.dtype, rows: int) -> None:
    cuda, device = dev.cuda, dev.name
    from forge.kernels.cuda.quant import dequantize_reference

    w = _quantized(kind, 1536, 577, seed=rows, device=device)
    x = torch.randn(rows, 2 * 1536, device=device, dtype=dtype)[:, :1536]  # strided rows
    y = poisoned((rows, w.out_features), dtype, device)
    cuda.ops.gemv(y, x, w)
    expected = x.float() @ dequantize_reference(w).to(device)
    scale = expected.abs().max().item()
    assert_close(y / scale, expected / scale, dtype)
    # The backend routes small batches to the GEMV and larger ones through dequantization.
    assert_close(cuda.linear(x, w) / scale, expected / scale, dtype)
    big = torch.randn(20, 1536, device=device, dtype=dtype)
    want = big.float() @ dequantize_reference(w).to(device)
    s = want.abs().max().item()
    assert_close(cuda.linear(big, w) / s, want / s, dtype)


# -- end to end ---------------------------------------------------------------------------------
def _greedy(model, backend, prompts: list[list[int]], steps: int, block_size: int = 16, runner=None) -> list[list[int]]:
    """Chunked prefill (each prompt in two chunks: the second runs over a cached prefix),
    then ``steps`` batched decode steps; returns the generated tokens."""
    from forge.kernels.batch import ForwardBatch

    device = backend.device
    max_len = max(len(p) for p in prompts) + steps + 1
    per_seq = math.ceil(max_len / block_size)
    num_blocks = 1 + per_seq * len(prompts)
    kv = runner.kv_caches if runner else backend.allocate_kv_cache(model.kv_spec, num_blocks, block_size)
    tables = torch.tensor([[1 + i * per_seq + j for j in range(per_seq)] for i in range(len(prompts))])
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)  # tokens already in the cache
    out: list[list[int]] = [[] for _ in prompts]

    def step(chunks: list[int]) -> list[int]:
        ids, pos, slots, starts, seq_lens, logit_rows = [], [], [], [0], [], []
        for i, n in enumerate(chunks):
            for p in range(done[i], done[i] + n):
                ids.append(seqs[i][p])
                pos.append(p)
                slots.append(int(tables[i, p // block_size]) * block_size + p % block_size)
            starts.append(starts[-1] + n)
            seq_lens.append(done[i] + n)
            logit_rows.append(starts[-1] - 1)
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(starts, device=device),
            seq_lens=torch.tensor(seq_lens, device=device),
            block_tables=tables.to(device),
            slot_mapping=torch.tensor(slots, device=device),
            block_size=block_size,
            query_lens_cpu=list(chunks),
            seq_lens_cpu=seq_lens,
        )
        batch = ForwardBatch(
            torch.tensor(ids, device=device),
            torch.tensor(pos, device=device),
            meta,
            torch.tensor(logit_rows, device=device),
        )
        logits = runner.run(batch) if runner else model.forward(batch, kv, backend)
        for i, n in enumerate(chunks):
            done[i] += n
        return backend.argmax(logits).tolist()

    step([len(p) // 2 for p in prompts])
    tokens = step([len(p) - len(p) // 2 for p in prompts])
    for _ in range(steps):
        for i, t in enumerate(tokens):
            out[i].append(t)
            seqs[i].append(t)
        tokens = step([1] * len(prompts))
    return out


PROMPTS = [[5, 17, 99, 3, 250, 8, 8, 41], [300, 2, 2, 2], list(range(10, 80)), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]


def test_greedy_outputs_equal_torch_backend(dev: Device) -> None:
    cuda, oracle, device = dev.cuda, dev.oracle, dev.name
    from forge.models.llama import build_tiny

    model = build_tiny(dtype="float32", device=device)
    assert _greedy(model, cuda, PROMPTS, 40) == _greedy(model, oracle, PROMPTS, 40)


@pytest.mark.parametrize("num_prompts", [1, 3])
def test_cuda_graph_replay_equals_eager(dev: Device, num_prompts: int) -> None:
    """GraphRunner over the backend: decode steps replay captured graphs (bucket 1, or bucket 4
    padded with one row) and give the eager backend's tokens, which equal TorchBackend's."""
    from forge.kernels.cuda_graphs import GraphRunner
    from forge.models.llama import build_tiny

    prompts = PROMPTS[:num_prompts]
    model = build_tiny(dtype="float32", device=dev.name)
    eager = _greedy(model, dev.cuda, prompts, 12)
    graphed = dev.backend(cuda_graphs=True)
    per_seq = math.ceil((max(len(p) for p in prompts) + 13) / 16)
    kv = graphed.allocate_kv_cache(model.kv_spec, 1 + per_seq * len(prompts), 16)
    runner = GraphRunner(model, kv, graphed, max_num_seqs=4, max_blocks_per_seq=per_seq)
    assert runner.enabled
    assert _greedy(model, graphed, prompts, 12, runner=runner) == eager == _greedy(model, dev.oracle, prompts, 12)
    assert set(runner._graphs) == {1, 2, 4}  # every bucket captured


@FULL
def test_q8_0_weights_stay_quantized_end_to_end(dev: Device) -> None:
    """A tiny model whose linear weights are Q8_0 on the GPU (GEMV at decode, dequantize +
    cuBLAS at prefill) generates what the same model with those weights dequantized does."""
    cuda, device = dev.cuda, dev.name
    from forge.kernels.cuda.quant import dequantize_reference, quantize_q8_0
    from forge.models.llama import build_tiny

    quantized = build_tiny(dtype="float32", device=device, hidden_size=128, intermediate_size=256)
    dense = build_tiny(dtype="float32", device=device, hidden_size=128, intermediate_size=256)
    for q_layer, d_layer in zip(quantized.layers, dense.layers, strict=True):
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            w = quantize_q8_0(getattr(q_layer, name).cpu())
            setattr(q_layer, name, cuda.pack_quantized(w))
            setattr(d_layer, name, dequantize_reference(w).to(device).contiguous())
    assert _greedy(quantized, cuda, PROMPTS, 30) == _greedy(dense, cuda, PROMPTS, 30)


def test_engine_greedy_equals_torch_backend(dev: Device) -> None:
    """The engine (scheduler, ModelRunner and its GraphRunner) on backend=cuda: requests of
    different lengths finish at different steps, so decode batches of 4, 3, 2 and 1 replay
    graphs of buckets 4, 2 and 1; the tokens are TorchBackend's."""
    from forge import LLM, SamplingParams
    from forge.kernels.cuda_graphs import GraphRunner

    prompts: list[str | list[int]] = ["Hello, forge", [256, 72, 105], "a somewhat longer prompt about kernels", "x"]
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (10, 6, 3, 8)]
    model = ["model=tiny", "model.dtype=float32"]
    want = [o.token_ids for o in LLM(*model, "backend=torch", f"backend.device={dev.name}").generate(prompts, params)]
    runtime = "cpu" if dev.runtime is not None else "null"
    llm = LLM(*model, "backend=cuda", f"backend.device={dev.name}", f"backend.runtime={runtime}")
    assert [o.token_ids for o in llm.generate(prompts, params)] == want
    assert isinstance(llm.engine.runner, ModelRunner)
    graphs = getattr(llm.engine.runner.forward, "__self__", None)  # the backend's forward: a GraphRunner's run
    assert isinstance(graphs, GraphRunner) and graphs.enabled
    if dev.runtime is not None:
        backend = llm.engine.runner.backend
        assert isinstance(backend, CudaBackend)
        replays = [g.replays for g in backend.graph_api.captured]
        assert len(replays) == len(graphs.buckets) and sum(replays) >= 8


@pytest.mark.realmodel
def test_smollm2_greedy_equals_torch_backend(dev: Device) -> None:
    """SmolLM2-135M (float32 weights dequantized from the Q4_1 GGUF): a few greedy steps on
    backend=cuda, eager and through GraphRunner, give TorchBackend's tokens."""
    from forge.kernels.cuda_graphs import GraphRunner
    from forge.models.fetch import smollm2_path
    from forge.models.gguf_loader import load_gguf

    model = load_gguf(str(smollm2_path()), device=dev.name, max_position=512)
    prompts = [model.tokenizer.encode(p) for p in ("The capital of France is", "def fibonacci(n):")]
    steps = 4
    want = _greedy(model, dev.oracle, prompts, steps)
    assert _greedy(model, dev.cuda, prompts, steps) == want
    graphed = dev.backend(cuda_graphs=True)
    per_seq = math.ceil((max(len(p) for p in prompts) + steps + 1) / 16)
    kv = graphed.allocate_kv_cache(model.kv_spec, 1 + per_seq * len(prompts), 16)
    warmup = 2 if dev.runtime is None else 0  # warm-up runs settle the GPU's allocator; nothing to settle on the CPU
    runner = GraphRunner(model, kv, graphed, max_num_seqs=2, max_blocks_per_seq=per_seq, warmup_runs=warmup)
    assert _greedy(model, graphed, prompts, steps, runner=runner) == want


@pytest.mark.realmodel
def test_gemma3_greedy_equals_torch_backend(dev: Device) -> None:
    """Gemma-3-270M on backend=cuda (which had no sliding-window kernel before): its local
    layers' window is cut to 8 so that the prompts outgrow it, on both backends alike."""
    import dataclasses

    from forge.models.fetch import gemma3_path
    from forge.models.gguf_loader import load_gguf

    model = load_gguf(str(gemma3_path()), device=dev.name, max_position=512)
    model.layers = [dataclasses.replace(layer, window=8) if layer.window else layer for layer in model.layers]
    assert any(layer.window for layer in model.layers) and any(layer.window is None for layer in model.layers)
    prompts = [model.tokenizer.encode(p) for p in ("The capital of France is the city of", "def fibonacci(n):")]
    assert _greedy(model, dev.cuda, prompts, 3) == _greedy(model, dev.oracle, prompts, 3)


@pytest.mark.parametrize("window", [4, None])
def test_cuda_graph_replay_under_inference_mode_equals_torch_backend(dev: Device, window: int | None) -> None:
    """The engine runs its steps under ``torch.inference_mode``: a toy Gemma-3 (q/k norms over strided
    heads; windowed and full layers) decoding 4 prompts in a captured bucket of 4 gives TorchBackend's
    tokens (the CPU layer's replays read freed memory there: NaN logits, token 0)."""
    from forge.kernels.cuda_graphs import GraphRunner
    from tests.window_fixtures import tiny_gemma3

    model = tiny_gemma3(dtype=torch.float32, window=window or 64, num_layers=3, device=dev.name)
    prompts = [p[:10] for p in PROMPTS]
    steps = 3
    want = _greedy(model, dev.oracle, prompts, steps, block_size=4)
    graphed = dev.backend(cuda_graphs=True)
    per_seq = math.ceil((max(len(p) for p in prompts) + steps + 1) / 4)
    kv = graphed.allocate_kv_cache(model.kv_spec, 1 + per_seq * len(prompts), 4)
    runner = GraphRunner(model, kv, graphed, max_num_seqs=4, max_blocks_per_seq=per_seq, warmup_runs=0)
    with torch.inference_mode():
        assert _greedy(model, graphed, prompts, steps, block_size=4, runner=runner) == want
