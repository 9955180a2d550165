"""Each GGML type's dequantization equals the ``gguf.quants`` reference bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from forge.models.gguf_quants import SUPPORTED_TYPES, dequantize

T = GGMLQuantizationType
QUANTIZABLE = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]  # gguf.quants can write these
K_QUANTS = [T.Q4_K, T.Q5_K, T.Q6_K]  # gguf.quants only reads these: random blocks instead


def test_required_types_supported() -> None:
    assert {T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q4_K, T.Q6_K} <= SUPPORTED_TYPES


@pytest.mark.parametrize("qtype", QUANTIZABLE, ids=lambda t: t.name)
def test_matches_reference_on_quantized_data(qtype: GGMLQuantizationType) -> None:
    rng = np.random.default_rng(int(qtype))
    data = (rng.standard_normal((48, 256)) * rng.uniform(0.01, 10, (48, 1))).astype(np.float32)
    data[3] = 0.0  # an all-zero block (scale 0)
    raw = quants.quantize(data, qtype)
    expected = quants.dequantize(raw, qtype)
    got = dequantize(raw, qtype, data.shape)
    assert got.dtype == torch.float32 and got.shape == data.shape
    np.testing.assert_array_equal(got.numpy(), expected)


def _random_blocks(qtype: GGMLQuantizationType, n: int, rng: np.random.Generator) -> np.ndarray:
    _, type_size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, type_size), dtype=np.uint8)
    scales = rng.uniform(-2, 2, (n, 2)).astype(np.float16).view(np.uint8)  # finite f16 scales
    if qtype == T.Q6_K:
        raw[:, -2:] = scales[:, :2]
    else:
        raw[:, 0:4] = scales
    return raw


@pytest.mark.parametrize("qtype", K_QUANTS, ids=lambda t: t.name)
def test_k_quants_match_reference_on_random_blocks(qtype: GGMLQuantizationType) -> None:
    raw = _random_blocks(qtype, 96, np.random.default_rng(int(qtype)))
    expected = quants.dequantize(raw, qtype)
    got = dequantize(raw, qtype, expected.shape)
    np.testing.assert_array_equal(got.numpy(), expected)


def test_float32_passthrough_and_shape() -> None:
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert torch.equal(dequantize(data, T.F32, (3, 4)), torch.from_numpy(data))


def test_unsupported_type_and_bad_sizes() -> None:
    with pytest.raises(NotImplementedError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), T.IQ2_XXS, (256,))
    with pytest.raises(ValueError, match="bytes"):
        dequantize(np.zeros(33, np.uint8), T.Q8_0, (32,))
    with pytest.raises(ValueError, match="whole number"):
        dequantize(np.zeros(34, np.uint8), T.Q8_0, (31,))
