"""Storage formats for the linear weights of a loaded decoder model (``forge.models.decoder``: every
family; the ``weights`` option).

- ``same``: keep the model dtype; with float32 this is the exact path.
- ``int8``: CPU only. Every linear weight (QKV, output, gate/up, down and the LM head) is
  quantized per output channel to int8; activations are quantized per row (per token) on
  the fly, and an exact int8 x int8 -> int32 product, rescaled by the row and channel scales,
  gives the output: ``torch._int_mm`` (oneDNN; fast with VNNI), or on a CPU with AVX2 and no VNNI
  forge's AVX2 kernel (``forge.kernels.cpu.qgemm``, which decides: ``forge_qgemm_preferred``),
  whose int32 sums are the same bits. (Quantization and rescaling run each in one pass on forge's
  C kernels when they build here: the same bits as the torch ops, which are the fallback.)
  Approximate: greedy continuations diverge from float32 after a few tokens
  (``tests/test_fast_weights_int8.py`` pins the measured agreement); use it for speed studies only.
- ``int4``: CPU only; for batch-1 decode. Every layer weight (QKV, output, gate/up, down) is also
  quantized to 4 bits in groups of 32 input channels with an asymmetric scale and zero per group
  (the grid of a Q4_1 GGUF, so SmolLM2's weights come back exactly up to the bfloat16 rounding of
  the group scales). A product with at most ``INT4_MAX_ROWS`` rows runs a 4-bit kernel: on a CPU
  with AVX2 and no VNNI forge's (``forge.kernels.cpu.qgemm.int4_gemm``: activations quantized to
  int16 per group of 32, llama.cpp's Q4_1 x Q8_1 with 16-bit activations), else ``torch._weight_int4pack_mm_for_cpu`` on
  bfloat16 activations (output back to float32). Either costs time linear in the rows, so a bigger
  product runs the ``int8`` product on an int8 copy of the same weight (both are kept).
  The LM head stays ``int8`` (4 bits there flip the greedy argmax), and for as few rows the top 16
  logits of each row are recomputed in float32 (``RescoredInt8Head``): with it the int4 kernel's
  SmolLM2 matches float32's top-1 at every prompt position we tried. Approximate, like ``int8``: with
  more rows (prefill, large batches) every product is the ``int8`` one.
- ``int8_fbgemm``: the earlier ``int8``: fbgemm's ``quantized::linear_dynamic`` with one
  activation scale per tensor. The down projection stays float32 there: its input
  (SiLU(gate) * up) has outliers that a per-tensor scale crushes.

bfloat16 linear weights are deliberately absent: on the CPU they were measured on (AMD EPYC with AVX-512
VNNI and AVX512_BF16, no AMX) plain bfloat16 GEMMs ran slower than float32 at every batch size tried.
"""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

import torch

from forge.kernels.base import LinearWeight, PackedLinear
from forge.kernels.cpu import native, qgemm
from forge.kernels.cpu.qgemm import INT4_GROUP_SIZE
from forge.models.decoder import DecoderModel

WEIGHT_FORMATS = ("same", "int8", "int4", "int8_fbgemm")
# Rows up to which the int4 kernel beats the int8 one on SmolLM2's shapes at one thread (measured with
# torch's kernels on a VNNI CPU). forge's AVX2 int8 kernel is faster than its int4 one from 2 rows on
# (reports/cpu/kernels.md), but the limit stays: short prompts keep the 4-bit grid in prefill and decode
# (with 1, SmolLM2's greedy continuation of a 5-token prompt diverged from float32 at token 5).
INT4_MAX_ROWS = 8


class Int8DynamicLinear(PackedLinear):
    """``x @ weight`` through fbgemm's dynamically quantized int8 GEMM (one activation scale per tensor)."""

    def __init__(self, weight_in_out: torch.Tensor) -> None:
        w = weight_in_out.detach().float().t().contiguous()  # fbgemm packs [out, in]
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # quantized-tensor deprecation notice
            qweight = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.in_features, self.out_features = weight_in_out.shape

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float().contiguous()
        out = torch.ops.quantized.linear_dynamic(flat, self._packed, False)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of each row of ``x [M, K]``: ``(q [M, K] int8, scale [M, 1])``
    with ``x ~= q * scale`` and ``|q| <= 127``."""
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-12).div_(127.0)
    return torch.round(x / scale).to(torch.int8), scale


class Int8RowwiseLinear(PackedLinear):
    """``x @ weight`` with int8 weights (one scale per output channel) and int8 activations
    (one scale per row, computed on the fly): ``(q_x @ q_w) * s_x * s_w`` through ``torch._int_mm``
    or, with ``forge_kernels`` (default: ``qgemm.forge_qgemm_preferred()``), forge's AVX2 kernel:
    the same bits either way."""

    def __init__(self, weight_in_out: torch.Tensor, forge_kernels: bool | None = None) -> None:
        w = weight_in_out.detach().float()
        self.in_features, self.out_features = w.shape
        self.scale = (w.abs().amax(dim=0) / 127.0).clamp_min(1e-12)  # [out]
        # Stored [out, in] and used transposed: oneDNN's int8 GEMM is fastest on that layout for few rows.
        self._qweight_out_in = torch.round(w / self.scale).to(torch.int8).t().contiguous()
        self._qweight_in_out = self._qweight_out_in.t()
        self._native = native.available()
        self.forge_kernels = qgemm.forge_qgemm_preferred() if forge_kernels is None else forge_kernels
        if self.forge_kernels and not self._native:
            raise ValueError("int8: forge's kernels were asked for but do not build here")

    @property
    def qweight(self) -> torch.Tensor:
        """The int8 weight, ``[in, out]`` (a transposed view)."""
        return self._qweight_in_out

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.dtype == torch.float32:  # the common case without reshapes and casts
            if self._native:  # the same bits in one pass each (forge.kernels.cpu.native)
                q, row_scale = native.quantize_rows(x.contiguous())
                if self.forge_kernels:
                    return qgemm.int8_gemm(q, self._qweight_out_in, row_scale, self.scale)
                return native.rescale_int_mm(torch._int_mm(q, self._qweight_in_out), row_scale, self.scale)
            q, row_scale = quantize_rows(x)
            return (torch._int_mm(q, self._qweight_in_out) * row_scale).mul_(self.scale)
        flat = x.reshape(-1, self.in_features)
        return self(flat.float()).reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_int4_groups(
    weight_in_out: torch.Tensor, group_size: int = INT4_GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit quantization of ``weight [K, N]`` in groups of ``group_size`` rows (input
    channels): ``(q [K, N] int32 in 0..15, scale [K/g, N] bf16, zero [K/g, N] bf16)`` with
    ``weight[k, n] ~= (q[k, n] - 8) * scale[k // g, n] + zero[k // g, n]`` (the int4 kernel's layout).

    Scale and zero are rounded to bfloat16 (what the kernel takes) before ``q`` is picked, so ``q``
    is the nearest level of the grid the kernel really uses."""
    k, n = weight_in_out.shape
    if k % group_size:
        raise ValueError(f"int4: {k} input channels is not a multiple of the group size {group_size}")
    groups = weight_in_out.detach().float().reshape(k // group_size, group_size, n)
    low, high = groups.amin(dim=1), groups.amax(dim=1)
    step = ((high - low) / 15.0).clamp_min(1e-12)
    # Both rounded from float32 values: level j moves by (zero' - zero) + (j - 8) (scale' - scale), at most
    # 2**-8 (|zero| + 8 scale) -- exactly 0 for weights whose grid is already bfloat16.
    scale, zero = step.to(torch.bfloat16), (low + 8.0 * step).to(torch.bfloat16)
    levels = (groups - zero.float()[:, None, :]) / scale.float()[:, None, :] + 8.0
    q = torch.round(levels).clamp_(0, 15).to(torch.int32).reshape(k, n)
    return q, scale, zero


def dequantize_int4_groups(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The float32 ``[K, N]`` weight that ``quantize_int4_groups``'s output stands for."""
    g = q.shape[0] // scale.shape[0]
    return (q.float() - 8.0) * scale.float().repeat_interleave(g, 0) + zero.float().repeat_interleave(g, 0)


def torch_int4_available() -> bool:
    return hasattr(torch, "_weight_int4pack_mm_for_cpu") and hasattr(torch, "_convert_weight_to_int4pack_for_cpu")


def int4_available() -> bool:
    """Whether ``Int4GroupLinear`` has a 4-bit kernel here (forge's where preferred, else torch's)."""
    return qgemm.forge_qgemm_preferred() or torch_int4_available()


class Int4GroupLinear(PackedLinear):
    """``x @ weight`` with 4-bit group-quantized weights (``quantize_int4_groups``) for at most
    ``max_rows`` rows: through forge's ``qgemm.int4_gemm`` with ``forge_kernels`` (default:
    ``qgemm.forge_qgemm_preferred()``), else ``torch._weight_int4pack_mm_for_cpu`` on bfloat16
    activations; more rows go through ``Int8RowwiseLinear`` on an int8 copy of the original weight."""

    def __init__(
        self, weight_in_out: torch.Tensor, max_rows: int = INT4_MAX_ROWS, forge_kernels: bool | None = None
    ) -> None:
        self.in_features, self.out_features = weight_in_out.shape
        if self.out_features % 16:
            raise ValueError(f"int4: {self.out_features} output channels is not a multiple of 16")
        self.max_rows = max_rows
        self.group_size = INT4_GROUP_SIZE
        q, self.scale, self.zero = quantize_int4_groups(weight_in_out, self.group_size)
        self.forge_kernels = qgemm.forge_qgemm_preferred() if forge_kernels is None else forge_kernels
        if self.forge_kernels:
            self._packed, self._scale_zero = qgemm.pack_int4(q, self.scale, self.zero)
        else:
            self._packed = torch._convert_weight_to_int4pack_for_cpu(q.t().contiguous(), 1)
            self._scale_zero = torch.stack((self.scale, self.zero), dim=-1).contiguous()  # [K/g, N, 2]
        self.fallback = Int8RowwiseLinear(weight_in_out, forge_kernels)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2 and x.shape[0] <= self.max_rows:  # the decode fast path: as few ops as possible
            if self.forge_kernels:
                return qgemm.int4_gemm(x.float().contiguous(), self._packed, self._scale_zero).to(x.dtype)
            return torch._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), self._packed, self.group_size, self._scale_zero
            ).to(x.dtype)
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.max_rows:
            return self.fallback(x)
        return self(flat).reshape(*x.shape[:-1], self.out_features)


class RescoredInt8Head(PackedLinear):
    """The LM head for ``int4``: every logit from the ``int8`` product; for at most ``max_rows`` rows the
    ``k`` best of each row are then recomputed in float32 from the exact weight, so the greedy argmax is
    float32's unless float32's winner falls outside the int8 top ``k``. Other logits keep the int8 error.
    (About 0.1 ms a row on SmolLM2, mostly the top-k; more rows skip it, like the int4 kernel.)"""

    def __init__(
        self,
        weight_in_out: torch.Tensor,
        exact_out_in: torch.Tensor | None = None,
        k: int = 16,
        max_rows: int = INT4_MAX_ROWS,
    ) -> None:
        self.in_features, self.out_features = weight_in_out.shape
        self.max_rows = max_rows
        self.approx = Int8RowwiseLinear(weight_in_out)
        # [out, in] so the candidates' rows are contiguous; a tied embedding table already is this.
        self.exact_out_in = weight_in_out.detach().float().t().contiguous() if exact_out_in is None else exact_out_in
        self.k = min(k, self.out_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).float()
        logits = self.approx(flat)
        if flat.shape[0] > self.max_rows:
            return logits.reshape(*x.shape[:-1], self.out_features).to(x.dtype)
        top = logits.topk(self.k, dim=-1, sorted=False).indices  # [M, k]
        exact = torch.bmm(self.exact_out_in[top], flat.unsqueeze(-1)).squeeze(-1)  # [M, k]
        return logits.scatter_(1, top, exact).reshape(*x.shape[:-1], self.out_features).to(x.dtype)


ModelT = TypeVar("ModelT", bound=DecoderModel[Any, Any])


def _rescored_head(model: DecoderModel[Any, Any]) -> LinearWeight:
    head = model.lm_head
    if isinstance(head, PackedLinear):
        return head
    tied = model.embed.shape == head.shape[::-1] and torch.equal(model.embed, head.t())
    return RescoredInt8Head(head, model.embed if tied else None)


def _pack_int4(name: str, weight: LinearWeight) -> LinearWeight:
    if isinstance(weight, PackedLinear):
        return weight
    k, n = weight.shape
    if k % INT4_GROUP_SIZE or n % 16:  # the kernel's layout constraints: such a layer stays int8
        return Int8RowwiseLinear(weight)
    return Int4GroupLinear(weight)


def _pack_int8(name: str, weight: LinearWeight) -> LinearWeight:
    return weight if isinstance(weight, PackedLinear) else Int8RowwiseLinear(weight)


def _pack_fbgemm(name: str, weight: LinearWeight) -> LinearWeight:
    # The down projection stays as it is: its input has outliers a per-tensor scale crushes.
    if name == "w_down" or isinstance(weight, PackedLinear):
        return weight
    return Int8DynamicLinear(weight)


def apply_weight_format(model: ModelT, weights: str) -> ModelT:
    """``model`` with its linear weights stored as ``weights`` (see the module doc): ``model`` itself for
    ``same``, else a copy sharing everything but the packed linears (``DecoderModel.with_linears``)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weights format {weights!r} (choose from {', '.join(WEIGHT_FORMATS)})")
    if weights == "same":
        return model
    if model.embed.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"weights={weights} needs a float32 model on the CPU")
    if weights == "int8_fbgemm":
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError("weights=int8_fbgemm needs a torch build with the fbgemm quantized engine")
        return model.with_linears(_pack_fbgemm, _pack_fbgemm("lm_head", model.lm_head))
    if weights == "int4":
        if not int4_available():
            raise ValueError(
                "weights=int4 needs forge's AVX2 kernels or torch._weight_int4pack_mm_for_cpu (torch >= 2.6)"
            )
        return model.with_linears(_pack_int4, _rescored_head(model))
    return model.with_linears(_pack_int8, _pack_int8("lm_head", model.lm_head))
