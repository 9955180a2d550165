"""A decoder's weights: those every layer has (``DecoderLayer``; ``LINEARS`` names the ones a weight
format may pack, ``forge.models.fast_weights``), how a family reads them from a Hugging Face-named
checkpoint (``TensorReader``), and ``apply_linear``, a stored weight applied to rows. Part of
``forge.models.decoder``, which re-exports these names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from forge.kernels.base import KernelBackend, LinearWeight, PackedLinear


def apply_linear(backend: KernelBackend, x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
    return weight(x) if isinstance(weight, PackedLinear) else backend.linear(x, weight)


@dataclass
class DecoderLayer:
    """The weights every decoder layer has; a family's layer adds its own (biases, extra norms)."""

    LINEARS: ClassVar[tuple[str, ...]] = ("wqkv", "wo", "w_gate_up", "w_down")

    attn_norm: torch.Tensor
    wqkv: LinearWeight
    wo: LinearWeight
    mlp_norm: torch.Tensor
    w_gate_up: LinearWeight
    w_down: LinearWeight


class TensorReader:
    """Hugging Face-named checkpoint tensors cast to the model's dtype and device; a missing one is a
    ``KeyError`` naming it (the loaders turn it into their own error)."""

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device) -> None:
        self.state = state
        self.dtype = dtype
        self.device = device

    def raw(self, name: str) -> torch.Tensor:
        if name not in self.state:
            raise KeyError(f"checkpoint lacks tensor {name!r}")
        return self.state[name]

    def get(self, name: str) -> torch.Tensor:
        return self.raw(name).to(device=self.device, dtype=self.dtype)

    def linear(self, name: str) -> torch.Tensor:
        """A ``[out, in]`` checkpoint weight as ``[in, out]``."""
        return self.get(name).t().contiguous()

    def fused(self, *names: str) -> torch.Tensor:
        """Several linear weights side by side (``[in, sum of out]``): fused QKV, gate/up."""
        return torch.cat([self.linear(n) for n in names], dim=1).contiguous()
