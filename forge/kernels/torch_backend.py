"""Reference kernels in plain torch (CPU, or CUDA when present).

torch is imported by the ops, not with this module: the backend of a simulated run whose model
computes on the host (``forge.engine.sim_runner.HostModel``) is built, and its numpy KV store
allocated, without loading torch."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from forge.kernels.base import AttentionMetadata, KernelBackend, KVLayer, KVSpec
from forge.kernels.kv_quant import dequantize, is_quantized, write_rows

if TYPE_CHECKING:
    import torch


def auto_device() -> str:
    """``device=auto``: ``cuda`` when torch sees a GPU, else ``cpu``. A torch build without GPU support
    (its ``torch/version.py`` sets ``cuda = None`` and ``hip = None``) answers ``cpu`` without
    importing torch; any other build is asked (``torch.cuda.is_available()``)."""
    spec = importlib.util.find_spec("torch")
    try:
        built = _constants(Path(spec.origin).with_name("version.py").read_text()) if spec and spec.origin else {}
    except (OSError, SyntaxError, ValueError):
        built = {}
    if "cuda" in built and "hip" in built and built["cuda"] is None and built["hip"] is None:
        return "cpu"
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _constants(source: str) -> dict[str, object]:
    """The names a module's top level assigns a literal constant to (``cuda: Optional[str] = None``)."""
    found: dict[str, object] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Constant):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            found.update({t.id: node.value.value for t in targets if isinstance(t, ast.Name)})
    return found


def gather_context(kv: KVLayer, block_table: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``seq_len`` cached K and V rows of one request, ``[seq_len, kv_heads, head_dim]``
    (float32, dequantized, from a quantized cache)."""
    k_cache, v_cache = kv
    block_size = k_cache.shape[1]
    nblocks = -(-seq_len // block_size)
    blocks = block_table[:nblocks]
    k = readable(k_cache.index_select(0, blocks).flatten(0, 1)[:seq_len])
    v = readable(v_cache.index_select(0, blocks).flatten(0, 1)[:seq_len])
    return k, v


def readable(rows: torch.Tensor) -> torch.Tensor:
    """Cache rows as attention reads them: dequantized to float32 from int8/fp8, else as they are."""
    return dequantize(rows) if is_quantized(rows.dtype) else rows


class TorchBackend(KernelBackend):
    name = "torch"

    def __init__(self, device: str = "auto", num_threads: int | None = None) -> None:
        """``num_threads``: torch's intra-op threads for this process (null: leave torch's as they
        are, every core in a fresh process). Set now when torch is loaded, else when this backend
        first allocates torch tensors: a run whose model computes on the host never loads torch."""
        if num_threads is not None and (isinstance(num_threads, bool) or num_threads < 1):
            raise ValueError(f"backend.num_threads must be null or an integer >= 1, got {num_threads!r}")
        if device == "auto":
            device = auto_device()
        super().__init__(device)
        self.num_threads = num_threads
        if "torch" in sys.modules:
            self._apply_num_threads()

    def _apply_num_threads(self) -> None:
        if self.num_threads is not None:
            import torch

            if torch.get_num_threads() != self.num_threads:
                torch.set_num_threads(self.num_threads)

    def allocate_kv_cache(self, spec: KVSpec, num_blocks: int, block_size: int) -> list[KVLayer]:
        self._apply_num_threads()
        return super().allocate_kv_cache(spec, num_blocks, block_size)

    def write_kv(self, kv: KVLayer, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        k_cache, v_cache = kv
        if is_quantized(k_cache.dtype):
            write_rows(k_cache, key, slot_mapping)
            write_rows(v_cache, value, slot_mapping)
            return
        if key.dtype != k_cache.dtype:
            key, value = key.to(k_cache.dtype), value.to(v_cache.dtype)
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, key)
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, value)

    def attention(
        self, query: torch.Tensor, kv: KVLayer, meta: AttentionMetadata, scale: float, window: int | None = None
    ) -> torch.Tensor:
        if window is not None and window < 1:
            raise ValueError(f"attention window must be >= 1, got {window}")
        import torch

        if query.shape[0] == meta.num_seqs:  # a pure decode step: one query row per request, in order
            return self.decode_attention(query, kv, meta, None, scale, window)
        out = torch.empty_like(query)
        single = [i for i, n in enumerate(meta.query_lens_cpu) if n == 1]
        multi = [i for i, n in enumerate(meta.query_lens_cpu) if n > 1]
        starts = meta.query_start_loc.tolist()
        if single:
            rows = torch.tensor([starts[i] for i in single], device=query.device)
            idx = torch.tensor(single, device=query.device)
            out[rows] = self.decode_attention(query[rows], kv, meta, idx, scale, window)
        for i in multi:
            s, e = starts[i], starts[i + 1]
            k, v = gather_context(kv, meta.block_tables[i], meta.seq_lens_cpu[i])
            out[s:e] = _causal_attention(query[s:e], k, v, scale, window)
        return out

    def decode_attention(
        self,
        q: torch.Tensor,
        kv: KVLayer,
        meta: AttentionMetadata,
        idx: torch.Tensor | None,
        scale: float,
        window: int | None = None,
    ) -> torch.Tensor:
        """Attention of ``q [len(idx), heads, head_dim]``, one query token for each of the requests
        ``idx`` of ``meta`` (all of them, in order, when None), over their cached contexts (the last
        ``window`` tokens of each when given). Here: all at once over contexts gathered from the
        cache and padded to the longest."""
        import torch
        import torch.nn.functional as F

        k_cache, v_cache = kv
        block_size = k_cache.shape[1]
        lens = meta.seq_lens_cpu if idx is None else [meta.seq_lens_cpu[i] for i in idx.tolist()]
        max_len = max(lens)
        nblocks = -(-max_len // block_size)
        b, h, kvh, d = q.shape[0], q.shape[1], k_cache.shape[2], q.shape[2]
        row = k_cache.shape[3]  # d, or d + the scale's bytes in a quantized cache
        tables = meta.block_tables[:, :nblocks] if idx is None else meta.block_tables[idx, :nblocks]
        # index_select on the flat block list copies whole blocks: several times cheaper than
        # advanced indexing with a 2-D index.
        flat = tables.reshape(-1)
        k = readable(k_cache.index_select(0, flat).view(b, nblocks * block_size, kvh, row)[:, :max_len])
        v = readable(v_cache.index_select(0, flat).view(b, nblocks * block_size, kvh, row)[:, :max_len])
        if k.dtype != q.dtype:
            k, v = k.to(q.dtype), v.to(q.dtype)
        if b == 1:  # batch-1 decode: two small batched matmuls over the KV heads beat SDPA's fixed cost
            first = max(0, max_len - window) if window is not None else 0
            k0, v0 = k[0, first:], v[0, first:]
            scores = torch.bmm(q.reshape(kvh, h // kvh, d), k0.permute(1, 2, 0))  # [kvh, group, L]
            probs = torch.softmax(scores.mul_(scale), dim=-1)
            return torch.bmm(probs, v0.transpose(0, 1)).view(1, h, d)
        mask = None
        if min(lens) < max_len or (window is not None and window < max_len):
            seq_lens = meta.seq_lens if idx is None else meta.seq_lens[idx]
            pos = torch.arange(max_len, device=q.device)[None, :]
            mask = pos < seq_lens[:, None]
            if window is not None:
                mask &= pos >= seq_lens[:, None] - window
            mask = mask[:, None, None, :]
        out = F.scaled_dot_product_attention(
            q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, scale=scale, enable_gqa=True
        )
        return out[:, :, 0]

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        import torch.nn.functional as F

        return F.rms_norm(x, weight.shape, weight, eps)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.nn.functional as F

        residual = x + residual
        return F.rms_norm(residual, weight.shape, weight, eps), residual

    def rope(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        cs = cos_sin.index_select(0, positions)
        half = cs.shape[-1] // 2
        # Broadcast over the two halves of each head ([T, heads, 2, half]): no repeated cos/sin tables.
        cos = cs[:, None, None, :half]
        sin = torch.stack((-cs[:, half:], cs[:, half:]), dim=1)[:, None]  # [T, 1, 2, half]: -sin, +sin
        if cs.dtype != query.dtype:
            cos, sin = cos.to(query.dtype), sin.to(query.dtype)
        return _rotate(query, cos, sin), _rotate(key, cos, sin)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        import torch.nn.functional as F

        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x @ weight

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * [cos, cos] + [-x2, x1] * [sin, sin]`` for ``x = [x1, x2]`` along the last dim, given
    ``cos [T, 1, 1, half]`` and ``sin [T, 1, 2, half]`` (``-sin`` then ``+sin``)."""
    halves = x.unflatten(-1, (2, -1))  # [T, heads, 2, half]
    return (halves * cos + halves.flip(-2) * sin).flatten(-2)


def _causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
) -> torch.Tensor:
    """``q [n, h, d]`` are the last n of ``k, v [L, kvh, d]``'s positions; each attends to the
    positions up to its own (only the last ``window`` of them when given)."""
    import torch
    import torch.nn.functional as F

    n, length = q.shape[0], k.shape[0]
    if window is not None and window >= length:
        window = None  # no query can see past the window
    mask = None
    if n < length or window is not None:  # query i sits at position length - n + i
        q_pos = torch.arange(length - n, length, device=q.device)[:, None]
        kv_pos = torch.arange(length, device=q.device)[None, :]
        mask = kv_pos <= q_pos
        if window is not None:
            mask &= kv_pos > q_pos - window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None],
        k.to(q.dtype).transpose(0, 1)[None],
        v.to(q.dtype).transpose(0, 1)[None],
        attn_mask=mask,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=True,
    )
    return out[0].transpose(0, 1)
