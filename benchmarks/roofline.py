"""This machine's limits for a decoder's token rate: memory bandwidth and GEMM peak, measured with torch,
and the arithmetic that turns them into a tok/s ceiling for one model in one weight format.

At batch 1 a decode step reads every weight once (the LM head included: a tied embedding table is read
whole as the head), plus the request's K/V, so ``bandwidth / bytes per token`` bounds its tok/s. With
many sequences per step the weights are shared and the step is bounded by arithmetic: ``2 x params``
FLOPs per token for the linear layers plus ``4 x layers x heads x head_dim x context`` for attention
(QK^T and PV), against the peak of the GEMM the format runs (float32, or int8 for int8/int4/Q8_0/Q4_1).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-style decoder that fix its bytes and FLOPs per token."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    @property
    def layer_params(self) -> int:
        """Linear weights of all decoder layers: Q, K, V, O, gate, up, down."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return self.layers * (q_o + k_v + 3 * self.hidden * self.ffn)

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    @classmethod
    def from_gguf(cls, path: Path) -> ModelShape:
        """The shape recorded in a ``llama``-architecture GGUF's metadata."""
        from gguf import GGUFReader

        fields = GGUFReader(str(path)).fields

        def value(key: str) -> int:
            return int(fields[f"llama.{key}"].parts[-1][0])

        heads = value("attention.head_count")
        return cls(
            layers=value("block_count"),
            hidden=value("embedding_length"),
            heads=heads,
            kv_heads=value("attention.head_count_kv"),
            head_dim=value("embedding_length") // heads,
            ffn=value("feed_forward_length"),
            vocab=value("vocab_size"),
        )


@dataclass(frozen=True)
class WeightBytes:
    """Bytes per parameter a format reads: decoder-layer linears, and the LM head."""

    layer: float
    head: float


def weight_bytes_per_token(shape: ModelShape, fmt: WeightBytes) -> float:
    return shape.layer_params * fmt.layer + shape.head_params * fmt.head


def kv_bytes_per_position(shape: ModelShape, element_bytes: float) -> float:
    """Bytes of K and V one cached position holds across all layers."""
    return shape.layers * 2 * shape.kv_heads * shape.head_dim * element_bytes


def decode_bytes_per_token(shape: ModelShape, fmt: WeightBytes, kv_element_bytes: float, context: float) -> float:
    """Bytes a batch-1 decode step reads: every weight once, and the K/V of ``context`` positions."""
    return weight_bytes_per_token(shape, fmt) + kv_bytes_per_position(shape, kv_element_bytes) * context


def flops_per_token(shape: ModelShape, context: float) -> float:
    """Multiply-adds x 2 for one token attending to ``context`` positions (linears, LM head, attention)."""
    linear = 2.0 * (shape.layer_params + shape.head_params)
    attention = 4.0 * shape.layers * shape.heads * shape.head_dim * context
    return linear + attention


def mean_context(prompt_len: int, output_len: int) -> float:
    """Mean context a decode step attends to while generating ``output_len`` tokens after the prompt."""
    return prompt_len + (output_len - 1) / 2


def sequence_flops(shape: ModelShape, prompt_len: int, output_len: int) -> float:
    """FLOPs to prefill a prompt and decode ``output_len`` tokens of one sequence (the last sampled
    token is never fed back): position ``p`` attends to ``p + 1`` positions."""
    fed = prompt_len + output_len - 1
    linear = fed * flops_per_token(shape, 0)
    attention = 4.0 * shape.layers * shape.heads * shape.head_dim * fed * (fed + 1) / 2
    return linear + attention


@dataclass(frozen=True)
class Limits:
    """What this machine sustains on ``threads`` threads: medians of several timed runs."""

    threads: int
    copy_bytes_per_s: float  # STREAM-style copy: bytes read + bytes written per second
    read_bytes_per_s: float  # a reduction over a large array: bytes read per second
    fp32_flops: float  # torch.mm float32, large square
    int8_ops: float  # the faster of torch._int_mm and fbgemm's int8 linear, large square
    int_mm_ops: float  # torch._int_mm alone (forge's int8 product on CPUs with VNNI)

    @property
    def bandwidth(self) -> float:
        """The batch-1 limit's bandwidth: the higher of copy and read (the stricter ceiling)."""
        return max(self.copy_bytes_per_s, self.read_bytes_per_s)

    def describe(self) -> str:
        return (
            f"copy {self.copy_bytes_per_s / 1e9:.1f} GB/s, read {self.read_bytes_per_s / 1e9:.1f} GB/s, "
            f"float32 GEMM {self.fp32_flops / 1e9:.0f} GFLOP/s, int8 GEMM {self.int8_ops / 1e9:.0f} GOP/s "
            f"(torch._int_mm {self.int_mm_ops / 1e9:.1f} GOP/s), {self.threads} threads"
        )


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def measure_limits(threads: int, repeats: int = 7, array_mib: int = 256, gemm_n: int = 2048) -> Limits:
    """Bandwidth over ``array_mib`` MiB float32 arrays (far beyond the caches) and GEMM peaks at
    ``gemm_n`` square, on ``threads`` torch threads (the caller's setting is restored)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.ones(array_mib * 2**20 // 4)
        dst = torch.empty_like(src)
        nbytes = src.numel() * 4
        copy = 2 * nbytes / median_seconds(lambda: dst.copy_(src), repeats)
        read = nbytes / median_seconds(lambda: src.sum(), repeats)
        a, b = torch.randn(gemm_n, gemm_n), torch.randn(gemm_n, gemm_n)
        fp32 = 2 * gemm_n**3 / median_seconds(lambda: torch.mm(a, b), repeats)
        # half the size: without AVX-512 VNNI torch._int_mm is a slow reference loop (~1 GOP/s)
        small = gemm_n // 2
        qa = torch.randint(-127, 128, (small, small), dtype=torch.int8)
        qb = torch.randint(-127, 128, (small, small), dtype=torch.int8)
        int_mm = 2 * small**3 / median_seconds(lambda: torch._int_mm(qa, qb), min(repeats, 3))
        int8 = max(int_mm, _fbgemm_int8_ops(a, b, repeats))
    finally:
        torch.set_num_threads(before)
    return Limits(threads, copy, read, fp32, int8, int_mm)


def _fbgemm_int8_ops(a: torch.Tensor, b: torch.Tensor, repeats: int) -> float:
    """int8 GEMM rate of fbgemm's dynamic int8 linear (activation quantization included); 0 without fbgemm."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return 0.0
    n = a.shape[0]
    scale = (b.abs().amax(dim=1) / 127.0).clamp_min(1e-8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qw = torch.quantize_per_channel(b, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
        packed = torch.ops.quantized.linear_prepack(qw, None)
    return 2 * n**3 / median_seconds(lambda: torch.ops.quantized.linear_dynamic(a, packed, False), repeats)


def gguf_weight_bytes(path: Path, shape: ModelShape) -> WeightBytes:
    """Bytes per parameter a GGUF's decode step reads: its ``blk.*`` matrices for the layers, and
    ``output.weight`` for the head (the whole ``token_embd.weight`` where the head is tied to it)."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    layer = sum(int(t.n_bytes) for name, t in tensors.items() if name.startswith("blk.") and len(t.shape) == 2)
    head = tensors.get("output.weight", tensors["token_embd.weight"])
    return WeightBytes(layer / shape.layer_params, int(head.n_bytes) / shape.head_params)
