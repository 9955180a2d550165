"""A model with no arithmetic: the next token is a hash of the seed and the last tokens it reads
back from the KV cache. A cache that loses, mixes or misplaces KV changes the output."""

from __future__ import annotations

import bisect
import itertools
import math
import struct
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from forge.core.decode_run import DecodeRun
from forge.core.outputs import SchedulerOutput
from forge.kernels.base import HostKVLayer, KernelBackend, KVLayer, KVSpec
from forge.kernels.cpu import synthetic as chain
from forge.models.base import Model, ModelDims, OneHotLogits
from forge.models.presets import model_dims
from forge.models.timing_only import FILL, LengthsTokenizer
from forge.tokenizers.base import ByteTokenizer

if TYPE_CHECKING:  # torch only for the tensor path (``forward``): the host path never imports it
    import torch

    from forge.kernels.batch import ForwardBatch

_FIRST, _LAST = 32, 127  # printable ASCII, so outputs decode to readable text
_PHI = 0.6180339887498949  # the golden ratio's fraction: stand-in hidden states' frequency step


class HostViews(NamedTuple):
    """A host cache's K and V slots as memoryviews, flat int64 arrays and the arrays' addresses."""

    k: memoryview
    v: memoryview
    k_array: np.ndarray
    v_array: np.ndarray
    addresses: tuple[int, int, int]  # K's, V's and their length in slots


class SyntheticModel(Model):
    """Order-``order`` deterministic Markov chain over printable bytes, read from the cache.

    With probability ``repetitiveness`` (decided by a hash, so still deterministic) the next
    token depends only on the last ``order`` tokens — contexts that recur continue the same
    way, which n-gram drafting can exploit; otherwise the position is mixed in too.
    Output lengths come from the workload (``max_tokens``); EOS is never produced.
    ``dims`` names the transformer whose cost the simulated clock charges for it.
    It is a ``forge.engine.sim_runner.HostModel``: ``forward_host`` reads and writes a host cache (numpy
    arrays, or CPU tensors) through a view of its memory, building no batch tensors and importing no
    torch (what makes simulated runs fast; the ``SimulationRunner`` calls it on CPU). Its cache holds
    token ids: ``kv_spec.dtype`` is ``"int64"``.
    """

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)
    event_runs = True  # its steps are those of forge.sim.event_replica's model, where it applies

    def __init__(
        self,
        seed: int = 0,
        order: int = 3,
        repetitiveness: float = 0.5,
        peak: float = 12.0,
        vocab_size: int = 320,
        max_position: int = 32768,
        dims: str = "llama-3-8b",
        device: str = "cpu",
        native: bool = True,
        timing_only: bool = False,
    ) -> None:
        if order < 1:
            raise ValueError(f"model.order must be >= 1, got {order}")
        if not 0.0 <= repetitiveness <= 1.0:
            raise ValueError(f"model.repetitiveness must be in [0, 1], got {repetitiveness}")
        if not 0.0 < peak < math.inf:  # the token's logit: greedy picks it (forward_host_run relies on it)
            raise ValueError(f"model.peak must be > 0 and finite, got {peak}")
        self.seed = seed
        self.order = order
        self.threshold = int(repetitiveness * 2**32)
        self.peak = peak
        self.vocab_size = vocab_size
        self.max_position = max_position
        # timing-only (``forge.models.timing_only``): prompts of one shared list per length, tokens not computed
        self.timing_only = timing_only
        self.tokenizer = LengthsTokenizer(vocab_size) if timing_only else ByteTokenizer(vocab_size)
        self.kv_spec = KVSpec(num_layers=1, num_kv_heads=1, head_dim=1, dtype="int64")
        self.dims: ModelDims = model_dims(dims)
        self.device = device  # where ``forward_host``'s logits go when made dense
        self.native = native  # decode with forge's C chain where it loads (False: the Python chain)
        # ``order`` consecutive int64 KV slots as a tuple, from a byte offset in the cache's host view
        self._unpack_context = struct.Struct(f"={order}q").unpack_from
        # the host views of the cache last run on, with the arrays or tensors they view (``_host_views``)
        self._views: tuple[object, object, HostViews] | None = None

    def next_token(self, context: tuple[int, ...], position: int) -> int:
        gate = hash((self.seed, -1, position, context[-1])) & 0xFFFFFFFF
        key = (self.seed, *context) if gate < self.threshold else (self.seed, position, *context)
        return _FIRST + hash(key) % (_LAST - _FIRST)

    def forward(self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend) -> torch.Tensor:
        import torch

        meta = batch.attn
        ids = batch.input_ids.view(-1, 1, 1)
        backend.write_kv(kv_caches[0], ids, ids, meta.slot_mapping)
        rows = batch.logits_indices.tolist()
        device = batch.input_ids.device
        if not rows:
            return OneHotLogits([], self.peak, self.vocab_size, device).dense()
        # Host-side index arithmetic: the positions of a request's queries are contiguous and end
        # at its seq_len, so row r of request i sits at position seq_lens[i] - (query_end[i] - r).
        ends = list(itertools.accumulate(meta.query_lens_cpu))
        bs = meta.block_size
        positions: list[int] = []
        seqs: list[int] = []
        blocks: list[int] = []
        for r in rows:
            i = bisect.bisect_right(ends, r)
            pos = meta.seq_lens_cpu[i] - (ends[i] - r)
            positions.append(pos)
            for p in range(max(pos - self.order + 1, 0), pos + 1):
                seqs.append(i)
                blocks.append(p // bs)
        block_ids = meta.block_tables[torch.tensor(seqs, device=device), torch.tensor(blocks, device=device)].tolist()
        slots: list[int] = []
        j = 0
        for pos in positions:
            for p in range(max(pos - self.order + 1, 0), pos + 1):
                slots.append(block_ids[j] * bs + p % bs)
                j += 1
        read = kv_caches[0][0].view(-1)[torch.tensor(slots, device=device)].tolist()  # the context, from the cache
        tokens: list[int] = []
        j = 0
        for pos in positions:
            n = min(pos + 1, self.order)
            ctx = (-1,) * (self.order - n) + tuple(read[j : j + n])
            j += n
            tokens.append(self.next_token(ctx, pos))
        return OneHotLogits(tokens, self.peak, self.vocab_size, device).dense()

    def forward_hidden(
        self, batch: ForwardBatch, kv_caches: list[KVLayer], backend: KernelBackend, rows: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward``'s logits and, for ``rows``, stand-in hidden states derived from the tokens alone
        (``forge.models.base.HiddenStateModel``): row r holds ``cos((id + 1) * k * PHI)`` for
        k = 1 .. ``dims.hidden_size``, id its token. Deterministic and distinct per token, so a
        simulated embedding is a function of the prompt's tokens (not of their order when mean-pooled)."""
        import torch

        logits = self.forward(batch, kv_caches, backend)
        ids = batch.input_ids.index_select(0, rows).to(torch.float64) + 1.0
        k = torch.arange(1, self.dims.hidden_size + 1, dtype=torch.float64, device=ids.device)
        return logits, torch.cos(torch.outer(ids, k * _PHI)).float()

    def forward_host(
        self, sched: SchedulerOutput, block_size: int, kv_caches: list[HostKVLayer] | list[KVLayer]
    ) -> OneHotLogits:
        """The step computed from the rows directly (``forge.engine.sim_runner.HostModel``); timing-only:
        ``FILL`` for every sampled row, the cache untouched."""
        if self.timing_only:
            rows = len(sched.decodes.starts) + sum(1 + s.num_draft_tokens for s in sched.chunks if s.sample)
            return OneHotLogits([FILL] * rows, self.peak, self.vocab_size, self.device)
        bs = block_size
        d = sched.decodes
        k, _, k_array, v_array, addresses = self._host_views(kv_caches[0])
        # What ``forward`` does, writing all before reading: the chunks' KV first (forge's C write where
        # it loads, else block by block as arrays), since a decode row may read it (a request admitted
        # with a prefix hit on blocks a chunk of this step computes decodes at once); then each decode
        # row writes and reads, in order (a row reads another's block only after that row allocated it,
        # and rows are in allocation order); then the chunks sample.
        for s in sched.chunks:
            if not (self.native and chain.write_tokens(addresses, bs, s.start, s.token_ids, s.block_table)):
                _write_chunk(k_array, v_array, s.block_table, bs, s.start, s.token_ids)
        tokens: list[int] = []
        if d.starts:
            ones = [1] * len(d.starts)
            tokens += itertools.chain.from_iterable(
                self._decode_rows(kv_caches[0], bs, d.starts, d.token_ids, ones, d.block_tables)
            )
        for s in sched.chunks:
            table = s.block_table
            if s.sample and s.num_tokens == 1:  # a one-token chunk (a prompt's last token): as a decode (rewritten)
                tokens += self._decode_rows(kv_caches[0], bs, [s.start], s.token_ids, [1], [table])[0]
            elif s.sample:
                end = s.start + s.num_tokens
                for pos in range(end - 1 - s.num_draft_tokens, end):
                    tokens.append(self.next_token(self._context(k, table, bs, pos), pos))
        return OneHotLogits(tokens, self.peak, self.vocab_size, self.device)

    def _host_views(self, layer: HostKVLayer | KVLayer) -> HostViews:
        """Views sharing the host cache's memory (numpy arrays, or CPU tensors), each slot one int64
        (1 head x head_dim 1): as memoryviews (fast single items), flat numpy arrays (fast runs) and
        addresses (the C chain). Made once per cache, not per step."""
        k_cache, v_cache = layer
        held = self._views
        if held is None or held[0] is not k_cache or held[1] is not v_cache:
            k_array, v_array = np.asarray(k_cache), np.asarray(v_cache)
            if not all(a.flags.c_contiguous and a.dtype == np.int64 for a in (k_array, v_array)):
                raise ValueError("the synthetic model's host cache must be contiguous int64 arrays")
            k_array, v_array = k_array.reshape(-1), v_array.reshape(-1)  # views: contiguous
            addresses = (k_array.ctypes.data, v_array.ctypes.data, len(k_array))
            held = self._views = (k_cache, v_cache, HostViews(k_array.data, v_array.data, k_array, v_array, addresses))
        return held[2]

    def forward_host_run(
        self, run: DecodeRun, block_size: int, kv_caches: list[HostKVLayer] | list[KVLayer]
    ) -> list[list[int]]:
        """The run's greedy tokens, row by row (``forge.engine.sim_runner.DecodeRunModel``): what
        ``forward_host`` computes step by step, each step's token the next step's input (timing-only: ``FILL``)."""
        if self.timing_only:
            return [[FILL] * n for n in run.num_steps]
        return self._decode_rows(kv_caches[0], block_size, run.starts, run.token_ids, run.num_steps, run.block_tables)

    def _decode_rows(
        self,
        layer: HostKVLayer | KVLayer,
        bs: int,
        starts: list[int],
        token_ids: list[int],
        num_steps: list[int],
        tables: list[list[int]],
    ) -> list[list[int]]:
        """Decode ``num_steps[i]`` tokens of row i: with forge's C chain (``forge.kernels.cpu.synthetic``)
        where it loads, else in Python (``_decode_row``); the same tokens and KV writes either way."""
        k, v, _, _, addresses = self._host_views(layer)
        model = (self.order, self.seed, self.threshold, _FIRST, _LAST - _FIRST)
        rows = (starts, token_ids, num_steps, tables)
        if self.native and (sampled := chain.decode_rows(addresses, bs, *model, rows)) is not None:
            return sampled
        decode_row = self._decode_row
        return [decode_row(k, v, bs, *row) for row in zip(starts, token_ids, tables, num_steps, strict=True)]

    def _decode_row(
        self, k: memoryview, v: memoryview, bs: int, p: int, token: int, table: list[int], n: int
    ) -> list[int]:
        """``n`` decode steps of one row from position ``p``: write the token at its position, then
        sample the token after it (``next_token`` inlined: this is a simulated run's whole model cost)."""
        seed, threshold, span, back = self.seed, self.threshold, _LAST - _FIRST, self.order - 1
        unpack, seed_key = self._unpack_context, (self.seed,)
        sampled: list[int] = []
        for p in range(p, p + n):  # noqa: B020 (p: the position, from the row's first)
            off = p % bs
            slot = table[p // bs] * bs + off
            k[slot] = v[slot] = token
            if off < back:  # the context spans blocks
                token = self.next_token(self._context(k, table, bs, p), p)
            elif hash((seed, -1, p, token)) & 0xFFFFFFFF < threshold:  # the gate (token: the last in ctx)
                token = _FIRST + hash(seed_key + unpack(k, 8 * (slot - back))) % span
            else:
                key = (seed, p) + unpack(k, 8 * (slot - back))  # noqa: RUF005 (faster than unpacking)
                token = _FIRST + hash(key) % span
            sampled.append(token)
        return sampled

    def _context(self, k: memoryview, table: list[int], bs: int, pos: int) -> tuple[int, ...]:
        """The ``order`` tokens ending at ``pos`` (-1 before the sequence), read from the cache's host view."""
        back = self.order - 1
        off = pos % bs
        if off >= back:  # within one block: one unpack
            return self._unpack_context(k, 8 * (table[pos // bs] * bs + off - back))
        first = pos - back
        ctx = tuple([k[table[q // bs] * bs + q % bs] for q in range(max(first, 0), pos + 1)])
        return (-1,) * -first + ctx if first < 0 else ctx


def _write_chunk(k: np.ndarray, v: np.ndarray, table: list[int], bs: int, start: int, token_ids: list[int]) -> None:
    """Write ``token_ids`` at positions ``start`` .. into the flat caches ``k`` and ``v`` through the
    block ``table``: the part of a first block it starts inside and of a last block it ends inside as
    slices, the whole blocks between as rows of a (blocks x ``bs``) view, the tokens packed to int64
    at once (what ``np.asarray(token_ids, dtype=np.int64)`` gives, built faster from a list)."""
    n = len(token_ids)
    ids = np.frombuffer(struct.pack(f"={n}q", *token_ids), dtype=np.int64)
    block, off = divmod(start, bs)
    done = 0
    if off:  # inside the first block
        done = min(bs - off, n)
        slot = table[block] * bs + off
        k[slot : slot + done] = v[slot : slot + done] = ids[:done]
        block += 1
    full = (n - done) // bs
    if full:
        rows = np.asarray(table[block : block + full], dtype=np.intp)
        whole = ids[done : done + full * bs].reshape(full, bs)
        k.reshape(-1, bs)[rows] = whole
        v.reshape(-1, bs)[rows] = whole
        done += full * bs
        block += full
    if done < n:  # the start of the last block
        slot = table[block] * bs
        k[slot : slot + n - done] = v[slot : slot + n - done] = ids[done:]
