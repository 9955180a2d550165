"""Storage formats for the linear weights of a loaded ``Llama`` (the ``weights`` option).

- ``same``: keep the model dtype; with float32 this is the exact path.
- ``int8``: CPU only. The QKV, output, gate/up projections and the LM head are quantized
  per output channel to int8 and prepacked for fbgemm; activations are quantized per
  tensor on the fly (``quantized::linear_dynamic``, int8 x int8 -> int32, AVX-512 VNNI).
  The down projection stays float32: its input (SiLU(gate) * up) has outliers that
  per-tensor activation scales crush (int8 there flipped ~1/3 of SmolLM2's top-1
  predictions; without it ~1 in 10 prompt positions flips). Approximate: greedy
  continuations diverge from float32 after a few tokens; use it for speed studies only.

bfloat16 linear weights are deliberately absent: on this CPU (AVX-512 VNNI, no
AVX512_BF16/AMX) they ran slower than float32 at every batch size we measured.
"""

from __future__ import annotations

import warnings

import torch

from forge.models.llama import LinearWeight, Llama, PackedLinear

WEIGHT_FORMATS = ("same", "int8")


class Int8DynamicLinear(PackedLinear):
    """``x @ weight`` through fbgemm's dynamically quantized int8 GEMM."""

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


def _int8(weight: LinearWeight) -> PackedLinear:
    return weight if isinstance(weight, PackedLinear) else Int8DynamicLinear(weight)


def apply_weight_format(model: Llama, weights: str) -> Llama:
    """``model`` with its linear weights stored as ``weights`` (see the module doc); in place."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown weights format {weights!r} (choose from {', '.join(WEIGHT_FORMATS)})")
    if weights == "same":
        return model
    if model.embed.device.type != "cpu" or model.dtype != torch.float32:
        raise ValueError("weights=int8 needs a float32 model on the CPU (fbgemm kernels)")
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        raise ValueError("weights=int8 needs a torch build with the fbgemm quantized engine")
    for layer in model.layers:
        layer.wqkv = _int8(layer.wqkv)
        layer.wo = _int8(layer.wo)
        layer.w_gate_up = _int8(layer.w_gate_up)
    model.lm_head = _int8(model.lm_head)
    return model
