"""Rotary position embedding tables: the inverse frequencies of a family's ``rope_theta`` and
``rope_scaling`` (llama3, linear, llama.cpp's ``freq_factors``) and the ``[max_position, head_dim]``
cos|sin table ``DecoderModel`` applies (``forge.models.decoder``, which re-exports these names)."""

from __future__ import annotations

import math
from typing import Any, Protocol

import torch


class RopeParams(Protocol):
    """What a rotary table is built from (every family's config is one)."""

    @property
    def head_dim(self) -> int: ...
    @property
    def rope_theta(self) -> float: ...
    @property
    def rope_scaling(self) -> dict[str, Any] | None: ...
    @property
    def max_position(self) -> int: ...


def rope_inv_freq(config: RopeParams) -> torch.Tensor:
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        smooth = (old_len / wavelen - low) / (high - low)
        scaled = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
        inv_freq = torch.where(mid, scaled, inv_freq)
    elif kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "freq_factors":  # llama.cpp's ``rope_freqs`` tensor: one divisor per frequency
        factors = torch.tensor(scaling["factors"], dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope freq_factors has {factors.numel()} entries, head_dim/2 is {inv_freq.numel()}")
        inv_freq = inv_freq / factors
    elif kind not in (None, "default"):
        raise ValueError(f"unsupported rope_scaling type {kind!r}")
    return inv_freq


def rope_cos_sin(config: RopeParams, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[max_position, head_dim]``: cos of each frequency, then sin; both times the scaling's
    ``attention_factor`` when it has one (LongRoPE's)."""
    t = torch.arange(config.max_position, dtype=torch.float64)
    freqs = torch.outer(t, rope_inv_freq(config))
    factor = float((config.rope_scaling or {}).get("attention_factor", 1.0))
    return (torch.cat((freqs.cos(), freqs.sin()), dim=-1) * factor).to(dtype=dtype, device=device)
