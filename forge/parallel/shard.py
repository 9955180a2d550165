"""A decoder model's tensor-parallel shard (Megatron-LM's split, as vLLM and SGLang use it):

- attention: each rank holds whole KV heads (a contiguous range, sizes differing by at most one) and
  the query heads that read them: the fused QKV projection is column-parallel, the output projection
  row-parallel (one all-reduce). With fewer KV heads than ranks, each KV head is replicated on
  ``world / num_kv_heads`` ranks, which split its query heads;
- MLP: gate/up column-parallel over a contiguous slice of the intermediate dimension, down row-parallel
  (one all-reduce);
- vocabulary: the embedding and the LM head split by vocabulary rows (``DecoderModel.lookup`` sums
  the ranks' rows, ``lm_head_logits`` gathers the ranks' columns).

Every rank's KV pool then holds its heads' share. Norm weights and other per-channel vectors are
replicated. A layer with weights this module does not know how to split is refused."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from dataclasses import dataclass
from typing import Any

import torch

from forge.kernels.base import LinearWeight, PackedLinear
from forge.models.decoder import DecoderLayer, DecoderModel, Shard, TensorParallelGroup


class ShardError(ValueError):
    """The model cannot be split this way (the message names why)."""


def even_ranges(n: int, parts: int) -> list[tuple[int, int]]:
    """``[0, n)`` cut into ``parts`` contiguous ranges whose sizes differ by at most one, larger first."""
    base, extra = divmod(n, parts)
    bounds = [0]
    for p in range(parts):
        bounds.append(bounds[-1] + base + (p < extra))
    return list(itertools.pairwise(bounds))


@dataclass(frozen=True)
class HeadSlice:
    """One rank's heads: query heads ``[q_start, q_end)`` and KV heads ``[kv_start, kv_end)``."""

    q_start: int
    q_end: int
    kv_start: int
    kv_end: int


def head_slices(num_heads: int, num_kv_heads: int, world: int) -> list[HeadSlice]:
    """Each rank's heads; every rank keeps the model's query-per-KV group size, which the attention
    kernels assume."""
    group = num_heads // num_kv_heads
    if num_kv_heads >= world:
        return [HeadSlice(a * group, b * group, a, b) for a, b in even_ranges(num_kv_heads, world)]
    copies = world // num_kv_heads
    if world % num_kv_heads or group % copies:
        raise ShardError(
            f"{num_kv_heads} KV heads of {group} query heads each cannot be split over {world} ranks"
            f" (with fewer KV heads than ranks, the ranks must be a multiple of the KV heads and split each group)"
        )
    per_rank = group // copies
    return [HeadSlice(r * per_rank, (r + 1) * per_rank, r // copies, r // copies + 1) for r in range(world)]


def _plain(w: LinearWeight) -> torch.Tensor:
    if isinstance(w, PackedLinear):
        raise ShardError("packed (quantized) weights cannot be split: use model.weights=same")
    return w


def _columns(w: torch.Tensor, ranges: list[tuple[int, int]]) -> torch.Tensor:
    return torch.cat([w[..., a:b] for a, b in ranges], dim=-1).contiguous()


def shard_layer(layer: DecoderLayer, heads: HeadSlice, mlp: tuple[int, int], config: Any) -> DecoderLayer:
    nq, nkv, d, inter = config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
    qkv_cols = [
        (heads.q_start * d, heads.q_end * d),
        (nq * d + heads.kv_start * d, nq * d + heads.kv_end * d),
        (nq * d + nkv * d + heads.kv_start * d, nq * d + nkv * d + heads.kv_end * d),
    ]
    changes: dict[str, Any] = {
        "wqkv": _columns(_plain(layer.wqkv), qkv_cols),
        "wo": _plain(layer.wo)[heads.q_start * d : heads.q_end * d].contiguous(),
        "w_gate_up": _columns(_plain(layer.w_gate_up), [mlp, (inter + mlp[0], inter + mlp[1])]),
        "w_down": _plain(layer.w_down)[mlp[0] : mlp[1]].contiguous(),
    }
    replicated = {config.hidden_size, d}
    for f in dataclasses.fields(layer):
        value = getattr(layer, f.name)
        if f.name in changes or not isinstance(value, torch.Tensor):
            continue
        if f.name == "bqkv":
            changes["bqkv"] = _columns(value, qkv_cols)
        elif value.dim() != 1 or value.numel() not in replicated:
            raise ShardError(f"{type(layer).__name__}.{f.name} ({tuple(value.shape)}): no tensor-parallel split for it")
    return dataclasses.replace(layer, **changes)


def check_shardable(model: DecoderModel[Any, Any], world: int) -> None:
    """Raise ``ShardError`` naming why ``model`` cannot be split over ``world`` ranks (before any rank starts)."""
    cfg = model.config
    if type(model).mlp is not DecoderModel.mlp or type(model).attention is not DecoderModel.attention:
        raise ShardError(f"{type(model).__name__} computes its own attention or MLP: no tensor-parallel split for it")
    if world > cfg.intermediate_size or world > model.vocab_size:
        raise ShardError(f"a model this small cannot be split over {world} ranks")
    heads = head_slices(cfg.num_heads, cfg.num_kv_heads, world)
    for layer in model.layers[:1]:  # every layer has the first one's fields
        shard_layer(layer, heads[0], even_ranges(cfg.intermediate_size, world)[0], cfg)
    _plain(model.lm_head)


def shard_decoder(model: DecoderModel[Any, Any], group: TensorParallelGroup) -> DecoderModel[Any, Any]:
    """``model``'s shard for ``group.rank``: a copy holding that rank's slices (see the module doc),
    its config saying the rank's head and intermediate counts, its ``kv_spec`` the rank's KV heads."""
    rank, world = group.rank, group.world_size
    check_shardable(model, world)
    cfg = model.config
    mlp_ranges = even_ranges(cfg.intermediate_size, world)
    heads = head_slices(cfg.num_heads, cfg.num_kv_heads, world)[rank]
    vocab = even_ranges(model.vocab_size, world)
    shard = copy.copy(model)
    shard.layers = [shard_layer(layer, heads, mlp_ranges[rank], cfg) for layer in model.layers]
    shard.config = dataclasses.replace(
        cfg,
        num_heads=heads.q_end - heads.q_start,
        num_kv_heads=heads.kv_end - heads.kv_start,
        intermediate_size=mlp_ranges[rank][1] - mlp_ranges[rank][0],
    )
    shard.embed = model.embed[vocab[rank][0] : vocab[rank][1]].contiguous()
    shard.lm_head = _plain(model.lm_head)[:, vocab[rank][0] : vocab[rank][1]].contiguous()
    shard.kv_spec = dataclasses.replace(model.kv_spec, num_kv_heads=heads.kv_end - heads.kv_start)
    shard.shard = Shard(group, vocab[rank][0], vocab[rank][1], tuple(b - a for a, b in vocab))
    return shard
