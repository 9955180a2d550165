"""Paged attention inputs for backend tests: random K/V in shuffled blocks and a dense reference."""

from __future__ import annotations

import torch

from forge.kernels.base import AttentionMetadata


def dense_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, window: int | None = None
) -> torch.Tensor:
    """q [n, h, d] are the last n positions of k, v [L, kvh, d]; with ``window`` each attends to
    its own position and the ``window - 1`` before it."""
    n, h, _ = q.shape
    length, kvh, _ = k.shape
    out = torch.empty_like(q)
    for i in range(n):
        pos = length - n + i
        lo = 0 if window is None else max(0, pos + 1 - window)
        for head in range(h):
            kh = head // (h // kvh)
            s = (k[lo : pos + 1, kh] @ q[i, head]) * scale
            out[i, head] = torch.softmax(s, 0) @ v[lo : pos + 1, kh]
    return out


def paged_batch(
    shapes: list[tuple[int, int]],
    bs: int,
    h: int,
    kvh: int,
    d: int,
    kv_dtype: torch.dtype,
    q_dtype: torch.dtype = torch.float32,
    seed: int = 0,
    scale: float = 0.3,
    window: int | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor], AttentionMetadata, torch.Tensor]:
    """Requests of ``(context before, new tokens)`` over random K/V in shuffled blocks of ``bs``:
    ``(queries, (k_cache, v_cache), metadata, reference)``, the reference computed densely in
    float64 from the cache's own values (attending to the last ``window`` positions when given).
    The new tokens' K/V are already in the cache."""
    gen = torch.Generator().manual_seed(seed)
    nblocks = sum(-(-(c + n) // bs) for c, n in shapes) + 3
    kv = (
        torch.randn(nblocks, bs, kvh, d, generator=gen).to(kv_dtype),
        torch.randn(nblocks, bs, kvh, d, generator=gen).to(kv_dtype),
    )
    perm = torch.randperm(nblocks, generator=gen).tolist()
    tables, slots, qs, refs = [], [], [], []
    for ctx, n in shapes:
        length = ctx + n
        table = [perm.pop() for _ in range(-(-length // bs))]
        tables.append(table)
        k_all = kv[0][table].flatten(0, 1)[:length].double()
        v_all = kv[1][table].flatten(0, 1)[:length].double()
        q = torch.randn(n, h, d, generator=gen).to(q_dtype)
        qs.append(q)
        refs.append(dense_attention(q.double(), k_all, v_all, scale, window))
        slots += [table[p // bs] * bs + p % bs for p in range(ctx, length)]
    width = max(map(len, tables))
    starts = [0]
    for _, n in shapes:
        starts.append(starts[-1] + n)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts),
        seq_lens=torch.tensor([c + n for c, n in shapes]),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables]),
        slot_mapping=torch.tensor(slots),
        block_size=bs,
        query_lens_cpu=[n for _, n in shapes],
        seq_lens_cpu=[c + n for c, n in shapes],
    )
    return torch.cat(qs), kv, meta, torch.cat(refs)
