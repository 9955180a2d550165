"""The reference kernels against straightforward dense computations."""

from __future__ import annotations

import pytest
import torch

from forge.kernels.torch_backend import TorchBackend
from tests.attention_helpers import paged_batch

# (context before, new tokens): a decode, a chunk with a cached prefix, a fresh prompt, a decode at a block edge;
# then a pure decode step (one query row per request), and a lone decode (the batch-1 path)
BATCHES = {"mixed": [(9, 1), (5, 6), (0, 7), (11, 1)], "decodes": [(9, 1), (3, 1), (16, 1)], "one-decode": [(13, 1)]}


@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_paged_attention_matches_dense(batch: str) -> None:
    q, kv, meta, ref = paged_batch(BATCHES[batch], 4, 6, 2, 8, torch.float64, torch.float64)
    torch.testing.assert_close(TorchBackend("cpu").attention(q, kv, meta, 0.3), ref)


# Sliding windows: one token (its own), cutting into most contexts, equal to a context, wider than all.
@pytest.mark.parametrize("window", [1, 3, 7, 40])
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_windowed_attention_matches_dense(batch: str, window: int) -> None:
    q, kv, meta, ref = paged_batch(BATCHES[batch], 4, 6, 2, 8, torch.float64, torch.float64, window=window)
    torch.testing.assert_close(TorchBackend("cpu").attention(q, kv, meta, 0.3, window=window), ref)


def test_window_changes_what_is_attended_and_must_be_positive() -> None:
    shapes = BATCHES["mixed"]
    q, kv, meta, full = paged_batch(shapes, 4, 6, 2, 8, torch.float64, torch.float64)
    _, _, _, cut = paged_batch(shapes, 4, 6, 2, 8, torch.float64, torch.float64, window=3)
    backend = TorchBackend("cpu")
    out = backend.attention(q, kv, meta, 0.3, window=3)
    torch.testing.assert_close(out, cut)
    assert not torch.allclose(out, full)
    with pytest.raises(ValueError, match="window"):
        backend.attention(q, kv, meta, 0.3, window=0)


def test_write_kv_places_rows_at_slots() -> None:
    backend = TorchBackend("cpu")
    kv = (torch.zeros(4, 2, 1, 3), torch.zeros(4, 2, 1, 3))
    key = torch.arange(6.0).view(2, 1, 3)
    backend.write_kv(kv, key, -key, torch.tensor([5, 0]))
    assert torch.equal(kv[0][2, 1], key[0])
    assert torch.equal(kv[0][0, 0], key[1])
    assert torch.equal(kv[1][2, 1], -key[0])
    assert kv[0].abs().sum() == key.abs().sum()


def test_rope_preserves_norm_and_is_relative() -> None:
    backend = TorchBackend("cpu")
    d = 8
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = torch.outer(torch.arange(32, dtype=torch.float64), inv)
    cos_sin = torch.cat((freqs.cos(), freqs.sin()), -1)
    q = torch.randn(1, 1, d, dtype=torch.float64)
    k = torch.randn(1, 1, d, dtype=torch.float64)
    dots = []
    for shift in (0, 5):
        qr, _ = backend.rope(q, k, torch.tensor([3 + shift]), cos_sin)
        _, kr = backend.rope(q, k, torch.tensor([1 + shift]), cos_sin)
        dots.append(float((qr * kr).sum()))
        torch.testing.assert_close(qr.norm(), q.norm())
    assert abs(dots[0] - dots[1]) < 1e-9


def test_add_rms_norm_and_silu_mul() -> None:
    backend = TorchBackend("cpu")
    x, r, w = torch.randn(3, 8), torch.randn(3, 8), torch.rand(8)
    normed, res = backend.add_rms_norm(x, r, w, 1e-6)
    torch.testing.assert_close(res, x + r)
    torch.testing.assert_close(normed, (x + r) / (x + r).pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * w)
    gu = torch.randn(2, 6)
    torch.testing.assert_close(backend.silu_mul(gu), torch.nn.functional.silu(gu[:, :3]) * gu[:, 3:])


def test_gelu_tanh_mul() -> None:
    gu = torch.randn(2, 6)
    gate, up = gu[:, :3], gu[:, 3:]
    tanh_gelu = 0.5 * gate * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (gate + 0.044715 * gate**3)))
    torch.testing.assert_close(TorchBackend("cpu").gelu_tanh_mul(gu), tanh_gelu * up)
