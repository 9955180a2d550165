"""The ``int8`` weight format (per-channel int8 weights, per-row int8 activations, ``torch._int_mm``).

Unit tests bound the error of one quantized product analytically; the real-model tests pin the
agreement with float32 SmolLM2 that we measured (approximate by design: see fast_weights).
"""

from __future__ import annotations

import pytest
import torch

from forge.kernels.base import PackedLinear
from forge.models.fast_weights import Int8RowwiseLinear, apply_weight_format, quantize_rows
from forge.models.llama import Llama, build_tiny
from tests.forward_helpers import greedy, prefill_logits, top1_agreement


def test_quantize_rows_round_trip_within_half_a_step() -> None:
    torch.manual_seed(0)
    x = torch.randn(7, 96) * torch.logspace(-3, 2, 7)[:, None]
    x[3, 5] = 50.0  # an outlier only coarsens its own row
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and scale.shape == (7, 1)
    assert q.abs().max() <= 127
    assert ((q.float() * scale - x).abs() <= scale / 2 * (1 + 1e-6)).all()
    assert (q.abs().amax(dim=1) == 127).all()  # each row uses its full range


def test_rowwise_linear_error_within_quantization_bound() -> None:
    """|x@w - x'@w'| <= sum_k (|x_k| |w_k - w'_k| + |w'_k| |x_k - x'_k|) <= (s_w sum|x| + s_x sum|w'|) / 2,
    with the int32 product exact; slack only for float32 rounding of the rescale."""
    torch.manual_seed(1)
    k, n = 160, 72
    w = torch.randn(k, n) / k**0.5
    w[:, 3] *= 20.0  # a loud output channel gets its own scale
    x = torch.randn(5, k)
    lin = Int8RowwiseLinear(w)
    out = lin(x)
    exact = x.double() @ w.double()
    _, s_x = quantize_rows(x)
    w_q = lin.qweight.double() * lin.scale.double()
    bound = 0.5 * (x.abs().sum(1, keepdim=True).double() * lin.scale.double() + s_x.double() * w_q.abs().sum(0))
    assert ((out.double() - exact).abs() <= bound * 1.001 + 1e-5).all()
    assert out.shape == (5, n) and out.dtype == torch.float32
    assert lin(x.view(5, 1, k)).shape == (5, 1, n)  # leading dims preserved
    torch.testing.assert_close(lin(x[:1]), out[:1])  # a row's result does not depend on the others


def test_apply_weight_format_packs_every_linear_and_keeps_same_untouched() -> None:
    model = build_tiny(dtype="float32")
    wqkv = model.layers[0].wqkv
    assert isinstance(wqkv, torch.Tensor) and isinstance(model.lm_head, torch.Tensor)
    before = wqkv.clone()
    same = apply_weight_format(model, "same")
    assert same is model and model.layers[0].wqkv is wqkv and torch.equal(wqkv, before)
    model = apply_weight_format(model, "int8")
    for layer in model.layers:
        for w in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down):
            assert isinstance(w, Int8RowwiseLinear)
    assert isinstance(model.lm_head, Int8RowwiseLinear)
    with pytest.raises(ValueError, match="unknown weights format"):
        apply_weight_format(build_tiny(dtype="float32"), "int3")
    with pytest.raises(ValueError, match="float32"):
        apply_weight_format(build_tiny(), "int8")  # tiny's default float64


def test_int8_fbgemm_keeps_down_projection_float() -> None:
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        pytest.skip("no fbgemm engine")
    model = apply_weight_format(build_tiny(dtype="float32"), "int8_fbgemm")
    layer = model.layers[0]
    assert isinstance(layer.wqkv, PackedLinear) and isinstance(layer.w_down, torch.Tensor)


def test_tiny_model_int8_tracks_float32() -> None:
    exact = build_tiny(dtype="float32")
    approx = apply_weight_format(build_tiny(dtype="float32"), "int8")
    ids = list(range(40, 90))
    a, b = prefill_logits(exact, ids), prefill_logits(approx, ids)
    # Random tiny weights have no outliers: the relative logit error stays at the int8 step (~1%).
    assert ((a - b).norm() / a.norm()).item() < 0.05


@pytest.mark.realmodel
class TestSmolLM2Int8:
    PROMPTS = (
        "The capital of France is",
        'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
        "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    )

    @pytest.fixture(scope="class")
    @classmethod
    def models(cls) -> tuple[Llama, Llama]:
        from forge.models.fetch import smollm2_path
        from forge.models.gguf_loader import load_gguf

        path = str(smollm2_path())
        exact, int8 = load_gguf(path, max_position=256), load_gguf(path, max_position=256, weights="int8")
        assert isinstance(exact, Llama) and isinstance(int8, Llama)
        return exact, int8

    def test_prompt_top1_agreement(self, models: tuple[Llama, Llama]) -> None:
        exact, approx = models
        same, total = top1_agreement(exact, approx, self.PROMPTS)
        assert same / total >= 0.9  # measured 37/39 (0.949) on this CPU; int8_fbgemm: 32/39

    def test_greedy_prefix_agrees(self, models: tuple[Llama, Llama]) -> None:
        exact, approx = models
        ids = exact.tokenizer.encode(self.PROMPTS[0])
        assert greedy(approx, ids, 4) == greedy(exact, ids, 4)  # measured: the first 5 tokens agree
