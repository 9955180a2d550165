"""A forge model as the drafter, with its own paged KV cache, plus a related-weights stand-in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from forge.core.outputs import ScheduledRequest, SchedulerOutput
from forge.core.request import Request
from forge.kernels.base import KernelBackend, KVLayer
from forge.kernels.batch import build_forward_batch
from forge.kvcache.context import KVCacheContext
from forge.kvcache.paged import PagedKVCache
from forge.models.base import Model
from forge.models.llama import Llama, LlamaConfig, random_state_dict, tiny_config
from forge.sampling.sampler import processed_probs, request_seed, row_generator
from forge.spec.base import Draft, Drafter
from forge.tokenizers.base import ByteTokenizer

_DRAFT_SALT = 0x5EED_D4AF7


@dataclass
class _Tracked:
    request: Request
    tokens: list[int]  # the request's tokens whose KV the drafter's cache holds, in order


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class DraftModelDrafter(Drafter):
    """Runs ``model`` autoregressively for up to ``num_speculative_tokens`` tokens per request.

    The drafter's cache (``num_blocks`` x ``block_size`` slots, bookkept by its own
    ``PagedKVCache``, tensors from ``backend``) holds, per request, the KV of a list of tokens.
    Before drafting, that list is cut to its longest common prefix with the request's current
    tokens, so rejected drafts, corrections and a target-side preemption (the request's tokens
    are unchanged, only the target's cache was dropped) all leave it consistent. When the pool
    is full, requests that are not running lose their drafter KV first; a request that still
    does not fit gets no draft this step.

    Greedy requests get the draft model's argmax (no distribution); sampled requests draw from
    the draft model's processed distribution ``q`` (temperature, top-k/p, min-p) with the very
    generator the target's sampler uses at that position (``row_generator(request seed,
    position)``, ``seed`` = the engine's). Sharing the draw's randomness couples
    the draft with the target's own draw (``torch.multinomial`` of one sample is an exponential
    race, so the two agree wherever ``q`` is close to ``p``); verification then emits the target's
    draws, which never depend on what was drafted.
    """

    def __init__(
        self,
        model: Model,
        backend: KernelBackend,
        num_speculative_tokens: int = 4,
        num_blocks: int = 1024,
        block_size: int = 16,
        seed: int = 0,
    ) -> None:
        if num_speculative_tokens < 1:
            raise ValueError(f"drafter.num_speculative_tokens must be >= 1, got {num_speculative_tokens}")
        self.model = model
        self.backend = backend
        self.num_speculative_tokens = num_speculative_tokens
        self.seed = seed
        self.kv = PagedKVCache(KVCacheContext(num_blocks, block_size))
        self.kv_caches: list[KVLayer] = backend.allocate_kv_cache(model.kv_spec, num_blocks, block_size)
        self._tracked: dict[str, _Tracked] = {}

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    def _seed(self, request: Request) -> int:
        return request_seed(request.sampling_params.seed, self.seed, request.request_id)

    def _sync(self, request: Request) -> int:
        """Cut the cached tokens to the common prefix with the request's; returns how many remain."""
        tokens = request.all_token_ids
        tracked = self._tracked.setdefault(request.request_id, _Tracked(request, []))
        keep = min(_common_prefix(tracked.tokens, tokens), len(tokens) - 1)
        del tracked.tokens[keep:]
        self.kv.trim(request, keep)
        return keep

    def _allocate(self, request: Request, num_tokens: int, running: set[str]) -> bool:
        if self.kv.allocate_slots(request, num_tokens, 0):
            return True
        for rid in [r for r in self._tracked if r not in running]:
            self.remove(rid)
        return self.kv.allocate_slots(request, num_tokens, 0)

    @torch.inference_mode()
    def propose(self, requests: Sequence[Request], limits: Mapping[str, int]) -> dict[str, Draft]:
        running = {r.request_id for r in requests}
        want: dict[str, int] = {}
        feed: dict[str, tuple[int, list[int]]] = {}  # request id -> (start position, tokens to compute)
        for r in requests:
            k = min(limits.get(r.request_id, 0), self.num_speculative_tokens, self.model.max_position - r.num_tokens)
            if k > 0:
                start = self._sync(r)
                want[r.request_id] = k
                feed[r.request_id] = (start, r.all_token_ids[start:])
        by_id = {r.request_id: r for r in requests}
        tokens: dict[str, list[int]] = {rid: [] for rid in want}
        for step in range(max(want.values(), default=0)):
            batch: list[ScheduledRequest] = []
            for rid, (start, new) in feed.items():
                if want[rid] <= step:
                    continue
                if not self._allocate(by_id[rid], start + len(new), running):
                    if step == 0:
                        self.remove(rid)
                    continue
                batch.append(ScheduledRequest(rid, start, len(new), new, self.kv.block_table(rid), sample=True))
            if not batch:
                break
            sched = SchedulerOutput(batch, sum(s.num_tokens for s in batch))
            fwd = build_forward_batch(sched, self.kv.block_size, self.backend.device)
            logits = self.model.forward(fwd, self.kv_caches, self.backend)
            feed = {}
            for row, s in enumerate(batch):
                request = by_id[s.request_id]
                self._tracked[s.request_id].tokens.extend(s.token_ids)
                position = s.start + s.num_tokens
                params = request.sampling_params
                if params.greedy:
                    token = int(logits[row].argmax())
                else:
                    q = processed_probs(logits[row], params)
                    g = row_generator(self._seed(request), position, logits.device)
                    token = int(torch.multinomial(q, 1, generator=g))
                tokens[s.request_id].append(token)
                feed[s.request_id] = (position, [token])
        return {rid: Draft(toks) for rid, toks in tokens.items() if toks}

    def remove(self, request_id: str) -> None:
        tracked = self._tracked.pop(request_id, None)
        if tracked is not None:
            self.kv.free(tracked.request)

    def num_tracked(self) -> int:
        return len(self._tracked)


def build_related_tiny(
    seed: int = 0,
    noise: float = 0.05,
    num_layers: int = 2,
    target_num_layers: int = 2,
    vocab_size: int = 320,
    hidden_size: int = 64,
    intermediate_size: int = 160,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    max_position: int = 4096,
    dtype: str = "float64",
    device: str = "cpu",
) -> Llama:
    """A drafter for ``build_tiny(seed, ...)``: the target's weights with relative Gaussian noise
    of scale ``noise`` added, keeping the first ``num_layers`` of its ``target_num_layers``."""
    if not 1 <= num_layers <= target_num_layers:
        raise ValueError(f"drafter num_layers must be in [1, {target_num_layers}], got {num_layers}")
    if noise < 0:
        raise ValueError(f"drafter noise must be >= 0, got {noise}")

    def config(layers: int) -> LlamaConfig:
        return tiny_config(vocab_size, hidden_size, intermediate_size, layers, num_heads, num_kv_heads, max_position)

    state = random_state_dict(config(target_num_layers), seed)
    g = torch.Generator().manual_seed(seed + 1)
    for name, w in state.items():
        state[name] = w + noise * w.std() * torch.randn(w.shape, generator=g, dtype=w.dtype)
    return Llama.from_state_dict(config(num_layers), state, ByteTokenizer(vocab_size), getattr(torch, dtype), device)
