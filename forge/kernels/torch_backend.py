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
        seq_lens = meta.seq_lens[idx]
        max_len = int(max(meta.seq_lens_cpu[i] for i in idx.tolist()))
        nblocks = -(-max_len // block_size)
        tables = meta.block_tables[idx, :nblocks]
        b, h, d = q.shape
        kvh = k_cache.shape[2]
        k = k_cache[tables].flatten(1, 2)[:, :max_len].to(q.dtype)  # [b, L, kvh, d]
        v = v_cache[tables].flatten(1, 2)[:, :max_len].to(q.dtype)
        g = h // kvh
        qg = q.view(b, kvh, g, d)
        # One batched matmul per KV head on strided views: no copy of the gathered context.
        scores = torch.empty(kvh, b, g, max_len, dtype=q.dtype, device=q.device)
        for j in range(kvh):
            torch.bmm(qg[:, j], k[:, :, j].transpose(1, 2), out=scores[j])
        scores *= scale
        pad = torch.arange(max_len, device=q.device)[None, :] >= seq_lens[:, None]
        scores.masked_fill_(pad[None, :, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out = torch.empty(kvh, b, g, d, dtype=q.dtype, device=q.device)
        for j in range(kvh):
            torch.bmm(probs[j], v[:, :, j], out=out[j])
        return out.permute(1, 0, 2, 3).reshape(b, h, d)

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
    n, h = q.shape[0], q.shape[1]
    length, kvh = k.shape[0], k.shape[1]
    k = k.to(q.dtype).repeat_interleave(h // kvh, dim=1)
    v = v.to(q.dtype).repeat_interleave(h // kvh, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) * scale
    q_pos = torch.arange(length - n, length, device=q.device)[:, None]
    k_pos = torch.arange(length, device=q.device)[None, :]
    scores.masked_fill_((k_pos > q_pos)[None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hnl,lhd->nhd", probs, v)
