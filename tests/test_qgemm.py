"""forge's AVX2 int8 / int4 matrix products (``forge.kernels.cpu.qgemm``) and the weight formats on them.

int8: the int32 sums are exact, so the result is ``torch._int_mm``'s bit for bit (odd shapes, every
tail of the vector loops). int4: within the analytic bound of its 16-bit activation quantization of a
float64 reference. Without a compiler, the weight formats keep torch's kernels.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from forge.kernels.cpu import native, qgemm
from forge.models.fast_weights import (
    INT4_GROUP_SIZE,
    Int4GroupLinear,
    Int8RowwiseLinear,
    apply_weight_format,
    dequantize_int4_groups,
    quantize_int4_groups,
)
from forge.models.llama import build_tiny
from tests.forward_helpers import prefill_logits

pytestmark = pytest.mark.skipif(not native.available(), reason="forge's C kernels do not build here")

# (M, N, K): vector-width K and not, column counts off the 4-wide tiles, row counts off the 2-row tiles.
INT8_SHAPES = [(1, 576, 576), (1, 7, 33), (2, 5, 1), (3, 13, 64), (5, 49, 100), (17, 66, 1536), (64, 130, 576)]


def random_int8(shape: tuple[int, int], gen: torch.Generator) -> torch.Tensor:
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=gen)


@pytest.mark.parametrize(("m", "n", "k"), INT8_SHAPES)
def test_int8_gemm_is_int_mm_bit_for_bit(m: int, n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w = random_int8((m, k), gen), random_int8((n, k), gen)
    x[0, : min(k, 40)] = 127  # the extremes: a pair of products at 2 * 127 * 127 must not saturate
    w[0, : min(k, 40)] = -127
    acc = qgemm.int8_gemm(x, w)
    exact = (x.to(torch.int64) @ w.t().to(torch.int64)).to(torch.int32)  # every sum fits int32
    assert acc.dtype == torch.int32 and torch.equal(acc, exact)
    if k > 1:  # torch 2.13's CPU _int_mm gave uninitialised memory for k = 1 once in a full run (0s, 1799016816)
        assert torch.equal(acc, torch._int_mm(x, w.t()))
    row_scale, col_scale = torch.rand(m, 1, generator=gen), torch.rand(n, generator=gen)
    scaled = qgemm.int8_gemm(x, w, row_scale, col_scale)
    assert torch.equal(scaled, native.rescale_int_mm(acc, row_scale, col_scale))


def test_int8_gemm_rejects_what_it_cannot_multiply() -> None:
    x = torch.zeros(2, 8, dtype=torch.int8)
    with pytest.raises(TypeError, match="int8"):
        qgemm.int8_gemm(x.float(), x)
    with pytest.raises(ValueError, match="contiguous"):
        qgemm.int8_gemm(x, torch.zeros(3, 9, dtype=torch.int8))
    with pytest.raises(ValueError, match="row_scale"):
        qgemm.int8_gemm(x, x, torch.ones(3, 1), torch.ones(2))


@pytest.mark.parametrize(("m", "n", "k"), [(1, 576, 576), (1, 3, 32), (3, 7, 64), (6, 13, 96), (9, 50, 1536)])
def test_int4_gemm_within_its_activation_rounding_of_float64(m: int, n: int, k: int) -> None:
    """Each activation moves by at most half its group's step ``max|x_group| / 32767``, so
    ``|out - x @ W| <= sum_k |W[k, n]| * step(k) / 2`` plus float32's rounding of the sums."""
    gen = torch.Generator().manual_seed(m + n + k)
    w = torch.randn(k, n, generator=gen)
    q, scale, zero = quantize_int4_groups(w)
    nibbles, scale_zero = qgemm.pack_int4(q, scale, zero)
    x = torch.randn(m, k, generator=gen) * torch.rand(m, k, generator=gen) * 10
    x[0, :INT4_GROUP_SIZE] = 0.0  # an all-zero group
    grid = dequantize_int4_groups(q, scale, zero).double()
    out = qgemm.int4_gemm(x, nibbles, scale_zero)
    ref = x.double() @ grid
    step = x.abs().reshape(m, -1, INT4_GROUP_SIZE).amax(-1).double() / 32767
    bound = (step.repeat_interleave(INT4_GROUP_SIZE, 1) / 2) @ grid.abs()
    float32_rounding = 1e-5 * (x.double().abs() @ grid.abs())
    assert out.shape == (m, n) and ((out.double() - ref).abs() <= bound + float32_rounding).all()


def test_int4_linear_on_forge_kernels_rows_are_independent_and_many_rows_are_int8() -> None:
    torch.manual_seed(5)
    w = torch.randn(192, 80) / 192**0.5
    lin = Int4GroupLinear(w, max_rows=4, forge_kernels=True)
    x = torch.randn(3, 192)
    out = lin(x)
    assert out.shape == (3, 80) and out.dtype == torch.float32
    torch.testing.assert_close(lin(x[1:2]), out[1:2], rtol=0, atol=0)
    torch.testing.assert_close(lin(x.view(3, 1, 192)).view(3, 80), out, rtol=0, atol=0)
    many = torch.randn(5, 192)
    assert torch.equal(lin(many), Int8RowwiseLinear(w, forge_kernels=False)(many))


def test_int8_linear_is_the_same_on_either_kernel() -> None:
    torch.manual_seed(6)
    w = torch.randn(100, 70)
    for rows in (1, 9):
        x = torch.randn(rows, 100)
        assert torch.equal(Int8RowwiseLinear(w, forge_kernels=True)(x), Int8RowwiseLinear(w, forge_kernels=False)(x))


def test_tiny_model_int8_logits_do_not_depend_on_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = list(range(40, 60))
    forge_side = prefill_logits(apply_weight_format(build_tiny(dtype="float32"), "int8"), ids)
    monkeypatch.setattr(qgemm, "forge_qgemm_preferred", lambda: False)
    torch_side = prefill_logits(apply_weight_format(build_tiny(dtype="float32"), "int8"), ids)
    assert torch.equal(forge_side, torch_side)


def test_the_choice_follows_the_cpu_flags() -> None:
    flags = qgemm.cpu_flags()
    assert qgemm.forge_qgemm_preferred() == ("avx2" in flags and not flags & qgemm.VNNI_FLAGS)


def test_without_a_compiler_the_weight_formats_keep_torchs_kernels(tmp_path: os.PathLike[str]) -> None:
    env = {**os.environ, "CC": "no-such-cc", "FORGE_CACHE_DIR": str(tmp_path)}
    code = (
        "import torch\n"
        "from forge.kernels.cpu import qgemm\n"
        "from forge.models.fast_weights import Int8RowwiseLinear, quantize_rows\n"
        "assert not qgemm.forge_qgemm_preferred()\n"
        "w, x = torch.randn(64, 24), torch.randn(3, 64)\n"
        "lin = Int8RowwiseLinear(w)\n"
        "q, s = quantize_rows(x)\n"
        "assert not lin.forge_kernels\n"
        "assert torch.equal(lin(x), (torch._int_mm(q, lin.qweight) * s).mul_(lin.scale))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
