"""The ``int4`` weight format (4-bit groups of 32 with scale and zero, ``torch._weight_int4pack_mm_for_cpu``
on bfloat16 activations for few rows, the ``int8`` product for more).

Unit tests: the quantizer's grid is exact for weights already on a bfloat16 Q4_1-like grid and within an
analytic bound otherwise; the kernel multiplies by exactly that grid. The real-model tests pin the
agreement with float32 SmolLM2 that we measured (approximate by design: see fast_weights).
"""

from __future__ import annotations

import pytest
import torch

from forge.kernels.base import LinearWeight
from forge.kernels.cpu import qgemm
from forge.models.fast_weights import (
    INT4_GROUP_SIZE,
    Int4GroupLinear,
    Int8RowwiseLinear,
    RescoredInt8Head,
    apply_weight_format,
    dequantize_int4_groups,
    int4_available,
    quantize_int4_groups,
)
from forge.models.llama import Llama, build_tiny
from tests.forward_helpers import greedy, prefill_logits, top1_agreement

pytestmark = pytest.mark.skipif(not int4_available(), reason="no int4 kernel here (forge's or torch's)")


def q4_1_like(k: int, n: int, seed: int, scale_dtype: torch.dtype) -> torch.Tensor:
    """``[k, n]`` weights ``(q - 8) * s + z`` per group of 32 rows, with q in 0..15 using both ends of
    the range in every group, and ``s``, ``z`` rounded to ``scale_dtype`` (GGUF's Q4_1 stores float16)."""
    g = torch.Generator().manual_seed(seed)
    groups = k // INT4_GROUP_SIZE
    q = torch.randint(0, 16, (groups, INT4_GROUP_SIZE, n), generator=g)
    q[:, 0], q[:, 1] = 0, 15
    s = (torch.rand(groups, 1, n, generator=g) * 0.02 + 1e-3).to(scale_dtype).float()
    z = (torch.randn(groups, 1, n, generator=g) * 0.05).to(scale_dtype).float()
    return ((q.float() - 8.0) * s + z).reshape(k, n)


def test_weights_on_a_bfloat16_grid_round_trip_exactly() -> None:
    w = q4_1_like(96, 48, seed=0, scale_dtype=torch.bfloat16)
    q, scale, zero = quantize_int4_groups(w)
    assert q.shape == w.shape and scale.shape == zero.shape == (3, 48) and scale.dtype == torch.bfloat16
    assert int(q.min()) == 0 and int(q.max()) == 15
    assert torch.equal(dequantize_int4_groups(q, scale, zero), w)


def test_q4_1_weights_lose_only_the_bfloat16_rounding_of_scale_and_zero() -> None:
    """float16 scales (as in a GGUF) do not fit bfloat16: each weight moves by at most
    ``|q - 8| * |s - s'| + |z - z'| <= 2**-8 * (8 s + |z|)`` (bfloat16's unit roundoff is 2**-8)."""
    w = q4_1_like(128, 64, seed=1, scale_dtype=torch.float16)
    q, scale, zero = quantize_int4_groups(w)
    err = (dequantize_int4_groups(q, scale, zero) - w).abs()
    s = scale.float().repeat_interleave(INT4_GROUP_SIZE, 0)
    z = zero.float().repeat_interleave(INT4_GROUP_SIZE, 0)
    assert (err <= 2**-8 * (8 * s + z.abs()) * 1.01 + 1e-7).all()
    assert (err < s / 2).all()  # every weight stays on its own level of the grid


def test_arbitrary_weights_within_half_a_step_plus_bfloat16_rounding() -> None:
    torch.manual_seed(2)
    w = torch.randn(160, 80) * torch.logspace(-3, 0, 80)
    w[7, 3] = 4.0  # an outlier only coarsens its own group
    q, scale, zero = quantize_int4_groups(w)
    err = (dequantize_int4_groups(q, scale, zero) - w).abs()
    s = scale.float().repeat_interleave(INT4_GROUP_SIZE, 0)
    z = zero.float().repeat_interleave(INT4_GROUP_SIZE, 0)
    assert (err <= s / 2 + 2**-8 * (8 * s + z.abs()) * 1.01 + 1e-7).all()
    with pytest.raises(ValueError, match="group size"):
        quantize_int4_groups(torch.randn(40, 16))


def test_int4_linear_multiplies_by_the_quantized_grid() -> None:
    torch.manual_seed(3)
    k, n = 192, 80
    w = torch.randn(k, n) / k**0.5
    lin = Int4GroupLinear(w, max_rows=4, forge_kernels=False)  # torch's kernel (forge's: tests/test_qgemm.py)
    x = torch.randn(3, k)
    out = lin(x)
    ref = x.bfloat16().double() @ dequantize_int4_groups(*quantize_int4_groups(w)).double()
    # Only the kernel's bfloat16 output rounding (2**-8 relative) and its float32 accumulation remain.
    assert ((out.double() - ref).abs() <= 2**-8 * ref.abs() + 1e-4).all()
    assert out.shape == (3, n) and out.dtype == torch.float32
    assert lin(x.view(3, 1, k)).shape == (3, 1, n)
    torch.testing.assert_close(lin(x.view(3, 1, k)).view(3, n), out)
    torch.testing.assert_close(lin(x[:1]), out[:1])  # a row's result does not depend on the others
    many = torch.randn(5, k)  # more than max_rows: the int8 copy
    assert torch.equal(lin(many), Int8RowwiseLinear(w, forge_kernels=False)(many))
    with pytest.raises(ValueError, match="multiple of 16"):
        Int4GroupLinear(torch.randn(64, 24))


def test_rescored_head_is_float32_on_its_top_k_and_int8_elsewhere() -> None:
    torch.manual_seed(4)
    k, n = 64, 400
    w = torch.randn(k, n)
    x = torch.randn(3, k)
    head = RescoredInt8Head(w, k=16, max_rows=3)
    out, int8, exact = head(x), Int8RowwiseLinear(w)(x), x.double() @ w.double()
    top = int8.topk(16, dim=-1).indices
    torch.testing.assert_close(out.gather(1, top).double(), exact.gather(1, top), rtol=1e-5, atol=1e-4)
    rest = torch.ones_like(out, dtype=torch.bool).scatter_(1, top, False)
    assert torch.equal(out[rest], int8[rest])
    assert torch.equal(out.argmax(-1), exact.argmax(-1))
    many = torch.randn(4, k)  # more than max_rows: the int8 product alone
    assert torch.equal(head(many), Int8RowwiseLinear(w)(many))


def test_apply_weight_format_int4_packs_layers_and_rescores_the_int8_head() -> None:
    model = apply_weight_format(build_tiny(dtype="float32"), "int4")
    for layer in model.layers:
        for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert isinstance(w, Int4GroupLinear)
    assert isinstance(model.lm_head, RescoredInt8Head)
    odd = apply_weight_format(build_tiny(dtype="float32", intermediate_size=176), "int4")
    assert isinstance(odd.layers[0].w_gate_up, Int4GroupLinear)
    assert isinstance(odd.layers[0].w_down, Int8RowwiseLinear)  # 176 inputs: not whole groups of 32
    with pytest.raises(ValueError, match="float32"):
        apply_weight_format(build_tiny(), "int4")


def test_missing_int4_kernel_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_weight_int4pack_mm_for_cpu")
    monkeypatch.setattr(qgemm, "forge_qgemm_preferred", lambda: False)  # a CPU without forge's kernels
    with pytest.raises(ValueError, match="int4"):
        apply_weight_format(build_tiny(dtype="float32"), "int4")


def test_tiny_model_int4_tracks_float32_on_its_grid() -> None:
    """Few rows take the int4 kernel: against float32 with the same 4-bit grid, only bfloat16
    activations and outputs differ (random Gaussian weights themselves lose ~8% per layer to 4 bits)."""
    exact = build_tiny(dtype="float32")
    for layer in exact.layers:
        for name in ("wqkv", "wo", "w_gate_up", "w_down"):
            setattr(layer, name, dequantize_int4_groups(*quantize_int4_groups(getattr(layer, name))))
    assert isinstance(exact.lm_head, torch.Tensor)
    exact.lm_head = RescoredInt8Head(exact.lm_head)
    approx = apply_weight_format(build_tiny(dtype="float32"), "int4")
    ids = list(range(40, 46))
    a, b = prefill_logits(exact, ids), prefill_logits(approx, ids)
    assert ((a - b).norm() / a.norm()).item() < 0.02


def test_tiny_model_int4_prefill_is_the_int8_product() -> None:
    ids = list(range(40, 90))  # 50 rows: more than INT4_MAX_ROWS
    int4 = prefill_logits(apply_weight_format(build_tiny(dtype="float32"), "int4"), ids)
    assert torch.equal(int4, prefill_logits(apply_weight_format(build_tiny(dtype="float32"), "int8"), ids))


@pytest.mark.realmodel
class TestSmolLM2Int4:
    PROMPTS = (
        "The capital of France is",
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    )

    @pytest.fixture(scope="class")
    @classmethod
    def models(cls) -> tuple[Llama, Llama, Llama]:
        """float32, ``weights=int4``, and int4 forced onto every row count (prefill included)."""
        from forge.models.fetch import smollm2_path
        from forge.models.gguf_loader import load_gguf

        path = str(smollm2_path())
        exact = load_gguf(path, max_position=256)
        assert isinstance(exact, Llama) and isinstance(exact.lm_head, torch.Tensor)

        def int4_on_every_row(_: str, weight: LinearWeight) -> LinearWeight:
            assert isinstance(weight, torch.Tensor)
            return Int4GroupLinear(weight, max_rows=1 << 20)

        forced = exact.with_linears(int4_on_every_row, RescoredInt8Head(exact.lm_head, exact.embed, max_rows=1 << 20))
        approx = load_gguf(path, max_position=256, weights="int4")
        assert isinstance(approx, Llama)
        assert isinstance(approx.lm_head, RescoredInt8Head) and approx.lm_head.exact_out_in is approx.embed  # tied
        return exact, approx, forced

    def test_layer_weights_are_on_the_int4_grid(self, models: tuple[Llama, Llama, Llama]) -> None:
        """SmolLM2's layers are Q4_1 in the GGUF: only the bfloat16 rounding of scale and zero is lost."""
        exact = models[0]
        for layer in exact.layers[:4]:
            w = layer.w_gate_up
            assert isinstance(w, torch.Tensor)
            err = (dequantize_int4_groups(*quantize_int4_groups(w)) - w).abs().max().item()
            assert err < 0.025  # measured 0.0215 over all 30 layers (int8 per channel: 0.036)

    def test_prompt_top1_agreement_with_int4_on_every_row(self, models: tuple[Llama, Llama, Llama]) -> None:
        exact, _, forced = models
        same, total = top1_agreement(exact, forced, self.PROMPTS)
        assert same / total >= 0.95  # measured 39/39 on this CPU (weights=int8: 37/39)

    def test_greedy_prefix_agrees(self, models: tuple[Llama, Llama, Llama]) -> None:
        exact, approx, forced = models
        ids = exact.tokenizer.encode(self.PROMPTS[0])
        want = greedy(exact, ids, 16)
        assert greedy(approx, ids, 16) == want  # measured: all 32 tokens agree (weights=int8: the first 5)
        assert greedy(forced, ids, 16) == want
