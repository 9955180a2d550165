"""The decoder-only transformer skeleton that every real model family specialises.

``DecoderModel.forward`` is the whole step: token embedding, per layer a pre-norm attention block
(fused QKV, per-head transform, rotary embedding, KV write and paged attention through the kernel
backend, output projection) and a pre-norm gated MLP (fused gate/up, gated activation, down), each
added to the residual stream with the backend's fused add + RMSNorm, then the final norm over the
rows whose logits are needed and the LM head. A family overrides only the hooks where it differs
(``embed_tokens``, ``qkv``, ``qk_heads``, ``rope_table``, ``attention_window``,
``attention_output``, ``gated_activation``, ``mlp_output``, ``final_logits``); the defaults are
Llama's.

Every linear weight is stored ``[in, out]`` (K x N contiguous) or as a ``PackedLinear``
(``forge.models.fast_weights``); ``DecoderLayer.LINEARS`` names the ones a weight format may pack.
The layer's weights and their checkpoint reader are ``forge.models.decoder_weights``, a
tensor-parallel shard's place ``forge.models.decoder_shard``, the rotary tables ``forge.models.rope``;
their names are importable from here too.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any, Generic, Protocol, Self, TypeVar

import torch

from forge.kernels.base import KernelBackend, KVLayer, KVSpec, LinearWeight
from forge.kernels.batch import ForwardBatch
from forge.models.base import Model, ModelDims
from forge.models.decoder_shard import Shard, TensorParallelGroup
from forge.models.decoder_weights import DecoderLayer, TensorReader, apply_linear
from forge.models.rope import RopeParams, rope_cos_sin, rope_inv_freq
from forge.tokenizers.base import Tokenizer

__all__ = [
    "DecoderConfig",
    "DecoderLayer",
    "DecoderModel",
    "RopeParams",
    "Shard",
    "TensorParallelGroup",
    "TensorReader",
    "apply_linear",
    "rope_cos_sin",
    "rope_inv_freq",
]


class DecoderConfig(RopeParams, Protocol):
    """The fields ``DecoderModel`` reads from a family's (frozen dataclass) config."""

    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def intermediate_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def rms_norm_eps(self) -> float: ...


ConfigT = TypeVar("ConfigT", bound=DecoderConfig)
LayerT = TypeVar("LayerT", bound=DecoderLayer)


class DecoderModel(Model, Generic[ConfigT, LayerT]):
    """A decoder-only transformer over a paged KV cache (see the module doc for the skeleton).

    Hooks a family may override, each called once per layer (or per step) inside ``forward``:
    ``embed_tokens`` (token ids -> hidden rows), ``qkv`` (normed rows -> fused q|k|v),
    ``qk_heads`` (per-head q, k before the rotary embedding), ``rope_table(layer)``,
    ``attention_window(layer)`` (sliding window or None), ``attention_scale``,
    ``attention_output`` (after the output projection, before the residual add),
    ``gated_activation`` (fused gate|up -> MLP hidden), ``mlp_output`` (after the down projection)
    and ``final_logits`` (float32 logits -> logits). They must not keep state between calls.

    ``forward`` is ``trunk`` (the layers) then ``logits`` (final norm + LM head) of the batch's
    ``logits_indices``; ``forward_hidden`` also returns the final-normed rows embeddings pool
    (``forge.models.base.HiddenStateModel``), so every family gives hidden states the same way.
    """

    def __init__(
        self,
        config: ConfigT,
        layers: list[LayerT],
        embed: torch.Tensor,
        norm: torch.Tensor,
        lm_head: LinearWeight,
        tokenizer: Tokenizer,
    ) -> None:
        if len(layers) != config.num_layers:
            raise ValueError(f"{len(layers)} layers given, the config has {config.num_layers}")
        self.config = config
        self.layers = layers
        self.embed = embed
        self.norm = norm
        self.lm_head = lm_head
        self.tokenizer = tokenizer
        self.vocab_size = config.vocab_size
        self.max_position = config.max_position
        self.dtype = embed.dtype
        self.kv_spec = KVSpec(config.num_layers, config.num_kv_heads, config.head_dim, embed.dtype)
        self.dims = ModelDims.of(config, bytes_per_param=embed.element_size())
        self.attention_scale = config.head_dim**-0.5
        self.cos_sin = rope_cos_sin(config, self.rope_dtype, embed.device)
        self.shard: Shard | None = None  # set on a tensor-parallel shard (forge.parallel.shard)

    @property
    def rope_dtype(self) -> torch.dtype:
        """Rotary tables are float32 unless the model computes in float64."""
        return torch.float32 if self.dtype != torch.float64 else self.dtype

    def with_linears(self, pack: Callable[[str, LinearWeight], LinearWeight], lm_head: LinearWeight) -> Self:
        """A copy whose layers hold ``pack(field, weight)`` for each of ``DecoderLayer.LINEARS`` and whose
        LM head is ``lm_head``; everything else (embeddings, norms, tables) is shared with ``self``."""

        def packed(layer: LayerT) -> LayerT:
            weights: dict[str, Any] = {name: pack(name, getattr(layer, name)) for name in layer.LINEARS}
            return dataclasses.replace(layer, **weights)

        model = copy.copy(self)
        model.layers = [packed(layer) for layer in self.layers]
        model.lm_head = lm_head
        return model

    # -- hooks (Llama's behaviour by default) --------------------------------------------------

    def lookup(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of ``input_ids``; on a shard, each rank holds a slice of the vocabulary
        and contributes its rows (zeros elsewhere) to a sum over the ranks."""
        if self.shard is None:
            return self.embed.index_select(0, input_ids)  # cheaper than advanced indexing, same rows
        local = input_ids - self.shard.vocab_start
        mine = (local >= 0) & (input_ids < self.shard.vocab_end)
        rows = self.embed.index_select(0, torch.where(mine, local, 0)) * mine.unsqueeze(1).to(self.embed.dtype)
        return self.shard.group.all_reduce(rows)

    def row_parallel(self, backend: KernelBackend, x: torch.Tensor, weight: LinearWeight) -> torch.Tensor:
        """``x @ weight`` for the output and down projections, whose input a shard holds a slice of:
        the partial products summed over the ranks."""
        out = apply_linear(backend, x, weight)
        return out if self.shard is None else self.shard.group.all_reduce(out)

    def lm_head_logits(self, backend: KernelBackend, x: torch.Tensor) -> torch.Tensor:
        logits = apply_linear(backend, x, self.lm_head)
        return logits if self.shard is None else self.shard.group.gather_columns(logits, self.shard.vocab_widths)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.lookup(input_ids)

    def qkv(self, layer: LayerT, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return apply_linear(backend, x, layer.wqkv)

    def qk_heads(
        self, layer: LayerT, q: torch.Tensor, k: torch.Tensor, backend: KernelBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def rope_table(self, index: int, layer: LayerT) -> torch.Tensor:
        return self.cos_sin

    def attention_window(self, index: int, layer: LayerT) -> int | None:
        return None

    def attention_output(self, layer: LayerT, h: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return h

    def layer_windows(self) -> tuple[int | None, ...]:
        return tuple(self.attention_window(i, layer) for i, layer in enumerate(self.layers))

    def gated_activation(self, gate_up: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return backend.silu_mul(gate_up)

    def mlp_output(self, layer: LayerT, h: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        return h

    def final_logits(self, logits: torch.Tensor) -> torch.Tensor:
        return logits

    # -- the skeleton --------------------------------------------------------------------------

    def attention(
        self, index: int, layer: LayerT, x: torch.Tensor, kv: KVLayer, batch: ForwardBatch, backend: KernelBackend
    ) -> torch.Tensor:
        """The attention block of layer ``index`` on its normed input ``x``; writes this step's K/V to ``kv``."""
        cfg = self.config
        nq, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q, k, v = self.qkv(layer, x, backend).split((nq * d, nkv * d, nkv * d), dim=-1)
        q, k = self.qk_heads(layer, q.view(-1, nq, d), k.view(-1, nkv, d), backend)
        q, k = backend.rope(q, k, batch.positions, self.rope_table(index, layer))
        meta = batch.attn_for(index)
        backend.write_kv(kv, k, v.view(-1, nkv, d), meta.slot_mapping)
        window = self.attention_window(index, layer)
        attn = backend.attention(q, kv, meta, self.attention_scale, window=window)
        return self.attention_output(layer, self.row_parallel(backend, attn.reshape(-1, nq * d), layer.wo), backend)

    def mlp(self, layer: LayerT, x: torch.Tensor, backend: KernelBackend) -> torch.Tensor:
        gate_up = apply_linear(backend, x, layer.w_gate_up)
        return self.mlp_output(
            layer, self.row_parallel(backend, self.gated_activation(gate_up, backend), layer.w_down), backend
        )

    def trunk(
        self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer over the batch (writing its K/V): the last layer's output and the residual
        stream before it, ``[T, hidden]`` each; the final norm adds and normalises them per row."""
        eps = self.config.rms_norm_eps
        h = self.embed_tokens(batch.input_ids)
        residual: torch.Tensor | None = None
        for index, (layer, kv) in enumerate(zip(self.layers, kv_caches, strict=True)):
            if residual is None:
                residual = h
                x = backend.rms_norm(h, layer.attn_norm, eps)
            else:
                x, residual = backend.add_rms_norm(h, residual, layer.attn_norm, eps)
            h = self.attention(index, layer, x, kv, batch, backend)
            x, residual = backend.add_rms_norm(h, residual, layer.mlp_norm, eps)
            h = self.mlp(layer, x, backend)
        assert residual is not None
        return h, residual

    def final_hidden(
        self, h: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor, backend: KernelBackend
    ) -> torch.Tensor:
        """The final hidden states (after the final norm) of ``rows`` of the batch, from ``trunk``'s output."""
        x, _ = backend.add_rms_norm(
            h.index_select(0, rows), residual.index_select(0, rows), self.norm, self.config.rms_norm_eps
        )
        return x

    def logits(
        self, h: torch.Tensor, residual: torch.Tensor, rows: torch.Tensor, backend: KernelBackend
    ) -> torch.Tensor:
        """Float32 logits of ``rows`` of the batch, from ``trunk``'s output."""
        x = self.final_hidden(h, residual, rows, backend)
        return self.final_logits(self.lm_head_logits(backend, x).float())

    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor:
        h, residual = self.trunk(batch, kv_caches, backend)
        return self.logits(h, residual, batch.logits_indices, backend)

    def forward_hidden(
        self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s logits and the final hidden states of ``rows`` (``HiddenStateModel``)."""
        h, residual = self.trunk(batch, kv_caches, backend)
        return self.logits(h, residual, batch.logits_indices, backend), self.final_hidden(h, residual, rows, backend)
