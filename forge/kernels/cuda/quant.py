"""GGUF block-quantized linear weights (Q8_0, Q4_K) that stay quantized on the GPU.

A ``QuantizedWeight`` stands for a dense ``[in_features, out_features]`` weight (the
layout ``KernelBackend.linear`` takes) but holds ggml's raw blocks: ``data`` is uint8
``[out_features, row_bytes]``, row n being the blocks of output feature n's ``in_features``
weights, exactly as a GGUF file stores a ``[out, in]`` tensor. Concatenating along the
output features (fused QKV, gate/up) is concatenating rows, so it stays quantized.

``dequantize_reference`` is the plain-torch definition the CUDA kernels are tested against
(and the fallback that TorchBackend-side code can use); ``quantize_q8_0`` and
``random_q4_k`` make test weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch


class GGMLType(IntEnum):
    """ggml type ids, as in GGUF tensor infos."""

    Q8_0 = 8
    Q4_K = 12


# (weights per block, bytes per block)
BLOCK_LAYOUT: dict[GGMLType, tuple[int, int]] = {
    GGMLType.Q8_0: (32, 34),
    GGMLType.Q4_K: (256, 144),
}


@dataclass(frozen=True, eq=False)
class QuantizedWeight:
    qtype: GGMLType
    data: torch.Tensor
    in_features: int
    out_features: int

    def __post_init__(self) -> None:
        block, nbytes = BLOCK_LAYOUT[self.qtype]
        if self.in_features % block:
            raise ValueError(f"{self.qtype.name} needs in_features divisible by {block}, got {self.in_features}")
        expected = (self.out_features, self.in_features // block * nbytes)
        if self.data.dtype != torch.uint8 or tuple(self.data.shape) != expected:
            raise ValueError(
                f"{self.qtype.name} data must be uint8 {list(expected)}, got {self.data.dtype} {list(self.data.shape)}"
            )
        if not self.data.is_contiguous():
            raise ValueError("quantized data must be contiguous")

    @classmethod
    def from_ggml(
        cls, qtype: GGMLType | int, raw: torch.Tensor, in_features: int, out_features: int
    ) -> QuantizedWeight:
        """From a GGUF tensor's raw bytes (any shape holding them in file order)."""
        qtype = GGMLType(qtype)
        block, nbytes = BLOCK_LAYOUT[qtype]
        data = raw.reshape(-1).view(torch.uint8).reshape(out_features, in_features // block * nbytes)
        return cls(qtype, data.contiguous(), in_features, out_features)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.in_features, self.out_features)

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: str | torch.device) -> QuantizedWeight:
        return QuantizedWeight(self.qtype, self.data.to(device), self.in_features, self.out_features)

    @staticmethod
    def cat_out(weights: list[QuantizedWeight]) -> QuantizedWeight:
        """Concatenate along the output features (rows of ``data``)."""
        first = weights[0]
        for w in weights[1:]:
            if w.qtype != first.qtype or w.in_features != first.in_features:
                raise ValueError("can only concatenate quantized weights of one type and in_features")
        data = torch.cat([w.data for w in weights], dim=0)
        return QuantizedWeight(first.qtype, data, first.in_features, sum(w.out_features for w in weights))


def _fp16(raw: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 from the last dim (2 bytes) of a uint8 tensor, as float32."""
    return raw.contiguous().view(torch.float16).to(torch.float32).squeeze(-1)


def _q4_k_scale_min(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's get_scale_min_k4 for sub-blocks 0..7: ``scales [..., 12]`` -> two ``[..., 8]``."""
    s = scales.to(torch.int32)
    low_sc = s[..., 0:4] & 63
    low_m = s[..., 4:8] & 63
    high_sc = (s[..., 8:12] & 0xF) | ((s[..., 0:4] >> 6) << 4)
    high_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat((low_sc, high_sc), -1).float(), torch.cat((low_m, high_m), -1).float()


def dequantize_rows(w: QuantizedWeight) -> torch.Tensor:
    """The weights as float32 ``[out_features, in_features]`` (ggml's row order)."""
    nbytes = BLOCK_LAYOUT[w.qtype][1]
    blocks = w.data.view(w.out_features, -1, nbytes)
    if w.qtype == GGMLType.Q8_0:
        d = _fp16(blocks[..., 0:2])
        qs = blocks[..., 2:34].contiguous().view(torch.int8).float()
        values = d[..., None] * qs
    else:
        d = _fp16(blocks[..., 0:2])[..., None]
        dmin = _fp16(blocks[..., 2:4])[..., None]
        sc, m = _q4_k_scale_min(blocks[..., 4:16])  # [out, nb, 8]
        qs = blocks[..., 16:144].to(torch.int32).view(w.out_features, -1, 4, 32)  # [out, nb, chunk, 32]
        nibbles = torch.stack((qs & 0xF, qs >> 4), dim=3).view(w.out_features, -1, 8, 32).float()
        values = (d * sc)[..., None] * nibbles - (dmin * m)[..., None]
    return values.reshape(w.out_features, w.in_features)


def dequantize_reference(w: QuantizedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The dense ``[in_features, out_features]`` weight ``linear`` would use."""
    return dequantize_rows(w).to(dtype).t()


def quantize_q8_0(weight: torch.Tensor) -> QuantizedWeight:
    """ggml's Q8_0 of a dense ``[in_features, out_features]`` weight: per 32 inputs,
    ``d = max|w| / 127`` (stored fp16) and ``q = round(w / d)``."""
    in_features, out_features = weight.shape
    rows = weight.t().reshape(out_features, -1, 32).float()
    amax = rows.abs().amax(-1, keepdim=True)
    d = amax / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    q = torch.round(rows * inv).clamp(-127, 127).to(torch.int8)
    d16 = d.to(torch.float16).view(torch.uint8).view(out_features, -1, 2)
    data = torch.cat((d16, q.view(torch.uint8)), dim=-1).reshape(out_features, -1)
    return QuantizedWeight(GGMLType.Q8_0, data.contiguous(), in_features, out_features)


def random_q4_k(
    in_features: int, out_features: int, generator: torch.Generator | None = None, scale: float = 1e-3
) -> QuantizedWeight:
    """Valid Q4_K super-blocks with random scales and nibbles; weights are about ``scale * 15 * 63``."""
    nb = in_features // 256
    raw = torch.randint(0, 256, (out_features, nb, 144), generator=generator, dtype=torch.uint8)
    d = (torch.rand(out_features, nb, 2, generator=generator) * scale).to(torch.float16)
    raw[..., 0:4] = d.view(torch.uint8).view(out_features, nb, 4)
    return QuantizedWeight(GGMLType.Q4_K, raw.reshape(out_features, -1).contiguous(), in_features, out_features)
