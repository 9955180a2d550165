"""The op interface every kernel backend implements.

A backend owns the KV tensors (one K and one V pool per layer, shaped
``[num_blocks, block_size, num_kv_heads, head_dim]``) and the ops that touch them.
Block bookkeeping lives in ``forge.kvcache`` and never sees a tensor.

This module imports no torch (it is imported where a tensor is made): a simulated run whose
model computes on the host (``forge.engine.sim_runner.HostModel``) keeps its KV in numpy arrays
(``allocate_host_kv_cache``) and never loads torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, Union

import numpy as np

from forge.kernels.kv_quant import KV_CACHE_DTYPES, is_quantized, row_width

if TYPE_CHECKING:
    import torch

    from forge.kernels.batch import ForwardBatch


@dataclass(frozen=True)
class KVSpec:
    """Shape of the KV cache a model needs. ``dtype``: what the cache stores, a torch dtype or a
    numpy dtype's name (``"int64"``: a cache of token ids that a model computing on the host keeps in
    numpy, ``KernelBackend.allocate_host_kv_cache``; as a tensor it is torch's dtype of that name).
    A quantized one (``forge.kernels.kv_quant``: int8, fp8) stores each (token, KV head) row as
    ``head_dim`` one-byte values followed by its float32 scale."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype | str

    def cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        """The shape of one layer's K (or V) pool."""
        return (num_blocks, block_size, self.num_kv_heads, row_width(self.dtype, self.head_dim))

    def bytes_per_token(self) -> int:
        """Bytes one token takes in the cache over all layers, K and V, scales included."""
        itemsize = np.dtype(self.dtype).itemsize if isinstance(self.dtype, str) else self.dtype.itemsize
        return 2 * self.num_layers * self.num_kv_heads * row_width(self.dtype, self.head_dim) * itemsize

    @property
    def is_floating_point(self) -> bool:
        """Whether the cache holds floating-point values (K/V), not e.g. token ids."""
        return np.dtype(self.dtype).kind == "f" if isinstance(self.dtype, str) else self.dtype.is_floating_point

    def torch_dtype(self) -> torch.dtype:
        """``dtype`` as a torch dtype (imports torch)."""
        import torch

        dtype: torch.dtype = getattr(torch, self.dtype) if isinstance(self.dtype, str) else self.dtype
        return dtype


KVLayer = tuple["torch.Tensor", "torch.Tensor"]
HostKVLayer = tuple[np.ndarray, np.ndarray]  # a layer's K and V pools in host memory (numpy)


@dataclass(frozen=True)
class AttentionMetadata:
    """Where each request's queries are in the flat batch and where its context lives.

    ``query_start_loc[i]:query_start_loc[i+1]`` are request i's new tokens; its context
    after this step is ``seq_lens[i]`` tokens, laid out in ``block_tables[i]`` (padded
    with 0). ``slot_mapping[t]`` is the flat cache slot new token t is written to.
    The ``*_cpu`` lists mirror the tensors for host-side loops.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    block_size: int
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_seqs(self) -> int:
        return len(self.seq_lens_cpu)

    @property
    def max_query_len(self) -> int:
        return max(self.query_lens_cpu, default=0)

    @property
    def max_seq_len(self) -> int:
        return max(self.seq_lens_cpu, default=0)


class ForwardModel(Protocol):
    """What a backend runs: every ``forge.models`` model (``Model.forward``)."""

    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor: ...


class KernelBackend(ABC):
    """Reference semantics are those of ``TorchBackend``; other backends must match them.

    ``kv_cache_dtypes``: the ``engine.kv_cache_dtype`` names the backend can store and read (the
    config refuses the others before anything loads)."""

    name: str = "base"
    kv_cache_dtypes: frozenset[str] = frozenset(KV_CACHE_DTYPES)

    def __init__(self, device: str = "cpu") -> None:
        """``device``: where the tensors live (``cpu``, ``cuda``, ``cuda:1``); no torch is imported
        until something asks for ``device`` as a ``torch.device``."""
        self.device_name = device
        self._device: torch.device | None = None

    @property
    def device(self) -> torch.device:
        """The backend's device as a ``torch.device`` (imports torch)."""
        if self._device is None:
            import torch

            self._device = torch.device(self.device_name)
        return self._device

    @device.setter
    def device(self, device: torch.device) -> None:
        self._device = device
        self.device_name = str(device)

    @property
    def device_type(self) -> str:
        """``cpu``, ``cuda``, ...: the device's kind, known without importing torch."""
        return self.device_name.split(":")[0]

    def allocate_kv_cache(self, spec: KVSpec, num_blocks: int, block_size: int) -> list[KVLayer]:
        import torch

        shape = spec.cache_shape(num_blocks, block_size)
        dtype = spec.torch_dtype()
        return [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(spec.num_layers)
        ]

    def allocate_host_kv_cache(self, spec: KVSpec, num_blocks: int, block_size: int) -> list[HostKVLayer]:
        """The pool of ``allocate_kv_cache`` as zeroed numpy arrays in host memory, for a model that
        computes on the host (``forge.engine.sim_runner.HostModel``): no torch. ``spec.dtype`` is a
        numpy dtype's name. ``torch.from_numpy`` of a layer is a tensor over the same memory."""
        if not isinstance(spec.dtype, str):
            raise TypeError(f"a host KV store holds a numpy dtype, got {spec.dtype}")
        shape = spec.cache_shape(num_blocks, block_size)
        return [(np.zeros(shape, dtype=spec.dtype), np.zeros(shape, dtype=spec.dtype)) for _ in range(spec.num_layers)]

    @staticmethod
    def copy_host_blocks(src: list[HostKVLayer], dst: list[HostKVLayer], pairs: list[tuple[int, int]]) -> None:
        """``copy_blocks`` for host stores (``allocate_host_kv_cache``), in numpy."""
        if not pairs:
            return
        src_ids = np.array([s for s, _ in pairs], dtype=np.int64)
        dst_ids = np.array([d for _, d in pairs], dtype=np.int64)
        for (sk, sv), (dk, dv) in zip(src, dst, strict=True):
            dk[dst_ids] = sk[src_ids]  # fancy indexing reads a copy: sources are read before any write
            dv[dst_ids] = sv[src_ids]

    def model_forward(
        self, model: ForwardModel, kv_caches: list[KVLayer], max_num_seqs: int, max_blocks_per_seq: int
    ) -> Callable[[ForwardBatch], torch.Tensor]:
        """How the model runner runs ``model`` over ``kv_caches`` on this backend: a function of the
        batch returning what ``model.forward(batch, kv_caches, self)`` returns. The default is that
        call; a backend may return an equivalent that is faster on it (CUDA graphs, say), for batches
        of at most ``max_num_seqs`` sequences of at most ``max_blocks_per_seq`` blocks."""
        return lambda batch: model.forward(batch, kv_caches, self)

    def copy_blocks(self, src: list[KVLayer], dst: list[KVLayer], pairs: list[tuple[int, int]]) -> None:
        """For every layer, K and V block ``s`` of ``src`` copied to block ``d`` of ``dst`` for each
        ``(s, d)`` in ``pairs`` (GPU pool <-> CPU pool for swapping, or within one pool for
        copy-on-write). Destinations are distinct; sources are read before any is written."""
        if not pairs:
            return
        import torch

        src_ids = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=src[0][0].device)
        dst_ids = torch.tensor([d for _, d in pairs], dtype=torch.long, device=dst[0][0].device)
        for (sk, sv), (dk, dv) in zip(src, dst, strict=True):
            for s, d in ((sk, dk), (sv, dv)):
                if is_quantized(s.dtype):  # bytes: torch has no index_copy for fp8 on the CPU
                    s, d = s.view(torch.uint8), d.view(torch.uint8)
                d.index_copy_(0, dst_ids, s.index_select(0, src_ids).to(d.device))

    @abstractmethod
    def write_kv(self, kv: KVLayer, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store ``key``/``value`` ``[T, kv_heads, head_dim]`` at flat slots ``slot_mapping [T]``,
        quantized (``forge.kernels.kv_quant.quantize``) when the cache's dtype is int8 or fp8."""

    @abstractmethod
    def attention(
        self, query: torch.Tensor, kv: KVLayer, meta: AttentionMetadata, scale: float, window: int | None = None
    ) -> torch.Tensor:
        """Causal attention of ``query [T, heads, head_dim]`` over each request's cached context
        (its new tokens already written). GQA when heads > kv_heads. Returns ``[T, heads, head_dim]``.
        A quantized cache is read as ``forge.kernels.kv_quant.dequantize`` of its rows.

        ``window`` (sliding-window attention): the query at position p attends only to positions
        ``p - window + 1 .. p`` (its own and the ``window - 1`` before it); None attends to all."""

    @abstractmethod
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    @abstractmethod
    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``residual' = x + residual``; returns ``(rms_norm(residual'), residual')``."""

    @abstractmethod
    def rope(
        self, query: torch.Tensor, key: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary embedding (rotate-half / NeoX layout). ``cos_sin [max_pos, head_dim]`` holds
        cos in the first half and sin in the second half of the last dim."""

    @abstractmethod
    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up = [gate | up]`` along the last dim."""

    def gelu_tanh_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``gelu(gate) * up`` (GELU's tanh approximation) for ``gate_up = [gate | up]`` along the last
        dim (GeGLU). Plain torch here, on the tensors' device; backends may override."""
        import torch

        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.gelu(gate, approximate="tanh") * up

    @abstractmethod
    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight`` with ``weight`` stored ``[in_features, out_features]``."""

    @abstractmethod
    def argmax(self, logits: torch.Tensor) -> torch.Tensor: ...


class PackedLinear(ABC):
    """A linear weight kept in a backend-specific packed format (``forge.models.fast_weights``);
    ``packed(x)`` computes ``x @ weight``. Plain tensors go through ``backend.linear``."""

    @abstractmethod
    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


LinearWeight = Union["torch.Tensor", PackedLinear]
