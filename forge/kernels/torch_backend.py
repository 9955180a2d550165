"""Reference kernels in plain torch (CPU, or CUDA when present)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from forge.kernels.base import AttentionMetadata, KernelBackend, KVLayer


def gather_context(kv: KVLayer, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` cached K and V rows of one request, ``[seq_len, kv_heads, head_dim]``."""
    k_cache, v_cache = kv
    block_size = k_cache.shape[1]
    nblocks = -(-seq_len // block_size)
    blocks = block_table[:nblocks]
    k = k_cache[blocks].flatten(0, 1)[:seq_len]
    v = v_cache[blocks].flatten(0, 1)[:seq_len]
    return k, v


class TorchBackend(KernelBackend):
    name = "torch"

    def __init__(self, device: str = "auto", num_threads: int | None = None) -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(device)
        if num_threads:
            torch.set_num_threads(num_threads)

    def write_kv(self, kv: KVLayer, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        k_cache, v_cache = kv
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value.to(v_cache.dtype))

    def attention(self, query: torch.Tensor, kv: KVLayer, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        if query.shape[0] == meta.num_seqs:  # a pure decode step: one query row per request, in order
            idx = torch.arange(meta.num_seqs, device=query.device)
            return self._decode_attention(query, kv, meta, idx, scale)
        out = torch.empty_like(query)
        single = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        multi = [i for i, n in enumerate(meta.query_lens_cpu) if n > 1]
        starts = meta.query_start_loc.tolist()
        if single:
            rows = torch.tensor([starts[i] for i in single], device=query.device)
            idx = torch.tensor(single, device=query.device)
            out[rows] = self._decode_attention(query[rows], kv, meta, idx, scale)
        for i in multi:
            s, e = starts[i], starts[i + 1]
            k, v = gather_context(kv, meta.block_tables[i], meta.seq_lens_cpu[i])
            out[s:e] = _causal_attention(query[s:e], k, v, scale)
        return out

    def _decode_attention(
        self, q: torch.Tensor, kv: KVLayer, meta: AttentionMetadata, idx: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """One query token per request, all requests at once over padded contexts."""
        k_cache, v_cache = kv
        block_size = k_cache.shape[1]
        lens = [meta.seq_lens_cpu[i] for i in idx.tolist()]
        max_len = max(lens)
        nblocks = -(-max_len // block_size)
        b, kvh, d = q.shape[0], k_cache.shape[2], k_cache.shape[3]
        # index_select on the flat block list copies whole blocks: several times cheaper than
        # advanced indexing with a 2-D index.
        flat = meta.block_tables[idx, :nblocks].reshape(-1)
        k = k_cache.index_select(0, flat).view(b, nblocks * block_size, kvh, d)[:, :max_len]
        v = v_cache.index_select(0, flat).view(b, nblocks * block_size, kvh, d)[:, :max_len]
        mask = None
        if min(lens) < max_len:
            mask = torch.arange(max_len, device=q.device)[None, :] < meta.seq_lens[idx][:, None]
            mask = mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q[:, :, None], k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype),
            attn_mask=mask, scale=scale, enable_gqa=True,
        )
        return out[:, :, 0]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(var + eps) * weight

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = x + residual
        return self.rms_norm(residual, weight, eps), residual

    def rope(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cs = cos_sin[positions]
        half = cs.shape[-1] // 2
        cos = cs[:, :half].repeat(1, 2)[:, None, :]
        sin = cs[:, half:].repeat(1, 2)[:, None, :]
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.to(x.dtype) + rotated * sin.to(x.dtype)).to(x.dtype)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """``q [n, h, d]`` are the last n of ``k, v [L, kvh, d]``'s positions."""
    n, length = q.shape[0], k.shape[0]
    mask = None
    if n < length:  # a chunk after a cached prefix: query i sits at position length - n + i
        q_pos = torch.arange(length - n, length, device=q.device)[:, None]
        mask = torch.arange(length, device=q.device)[None, :] <= q_pos
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], k.to(q.dtype).transpose(0, 1)[None], v.to(q.dtype).transpose(0, 1)[None],
        attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True,
    )
    return out[0].transpose(0, 1)
