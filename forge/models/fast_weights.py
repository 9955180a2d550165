"""Storage formats for the linear weights of a loaded ``Llama`` (the ``weights`` option).

- ``same``: keep the model dtype; with float32 this is the exact path.
- ``int8``: CPU only. Every linear weight (QKV, output, gate/up, down and the LM head) is
  quantized per output channel to int8; activations are quantized per row (per token) on
  the fly, and ``torch._int_mm`` (int8 x int8 -> int32, AVX-512 VNNI through oneDNN) does
  the product, rescaled by the row and channel scales. Approximate: greedy continuations
  diverge from float32 after a few tokens (``tests/test_fast_weights_int8.py`` pins the
  measured agreement); use it for speed studies only.
- ``int8_fbgemm``: the earlier ``int8``: fbgemm's ``quantized::linear_dynamic`` with one
  activation scale per tensor. The down projection stays float32 there: its input
  (SiLU(gate) * up) has outliers that a per-tensor scale crushes.

bfloat16 linear weights are deliberately absent: on this CPU (AVX-512 VNNI, no
AVX512_BF16/AMX) they ran slower than float32 at every batch size we measured.
"""

from __future__ import annotations

import warnings

import torch

from forge.models.llama import LinearWeight, Llama, PackedLinear

WEIGHT_FORMATS = ("same", "int8", "int8_fbgemm")


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
    (one scale per row, computed on the fly): ``(q_x @ q_w) * s_x * s_w`` through ``torch._int_mm``."""

    def __init__(self, weight_in_out: torch.Tensor) -> None:
        w = weight_in_out.detach().float()
        self.in_features, self.out_features = w.shape
        self.scale = (w.abs().amax(dim=0) / 127.0).clamp_min(1e-12)  # [out]
        # Stored [out, in] and used transposed: oneDNN's int8 GEMM is fastest on that layout for few rows.
        self._qweight_out_in = torch.round(w / self.scale).to(torch.int8).t().contiguous()

    @property
    def qweight(self) -> torch.Tensor:
        """The int8 weight, ``[in, out]`` (a transposed view)."""
        return self._qweight_out_in.t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        q, row_scale = quantize_rows(flat.float())
        out = torch._int_mm(q, self.qweight) * row_scale
        out.mul_(self.scale)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _pack(weight: LinearWeight, kind: type[PackedLinear]) -> LinearWeight:
    return weight if isinstance(weight, PackedLinear) else kind(weight)  # type: ignore[call-arg]


def apply_weight_format(model: Llama, weights: str) -> Llama:
    """``model`` with its linear weights stored as ``weights`` (see the module doc); in place."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weights format {weights!r} (choose from {', '.join(WEIGHT_FORMATS)})")
    if weights == "same":
        return model
    if model.embed.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError(f"weights={weights} needs a float32 model on the CPU")
    if weights == "int8_fbgemm":
        if "fbgemm" not in torch.backends.quantized.supported_engines:
            raise ValueError("weights=int8_fbgemm needs a torch build with the fbgemm quantized engine")
        for layer in model.layers:
            layer.wqkv = _pack(layer.wqkv, Int8DynamicLinear)
            layer.wo = _pack(layer.wo, Int8DynamicLinear)
            layer.w_gate_up = _pack(layer.w_gate_up, Int8DynamicLinear)
        model.lm_head = _pack(model.lm_head, Int8DynamicLinear)
        return model
    for layer in model.layers:
        layer.wqkv = _pack(layer.wqkv, Int8RowwiseLinear)
        layer.wo = _pack(layer.wo, Int8RowwiseLinear)
        layer.w_gate_up = _pack(layer.w_gate_up, Int8RowwiseLinear)
        layer.w_down = _pack(layer.w_down, Int8RowwiseLinear)
    model.lm_head = _pack(model.lm_head, Int8RowwiseLinear)
    return model
