"""Turns a SchedulerOutput into a ForwardBatch, runs the model, and samples."""

from __future__ import annotations

import dataclasses
import logging

import torch

from forge.core.kv_groups import KVCacheGroups
from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.core.request import Request
from forge.engine.pooling import PoolingRows
from forge.engine.runner_base import Runner
from forge.kernels.base import KernelBackend, KVLayer, KVSpec
from forge.kernels.batch import build_forward_batch
from forge.models.base import HiddenStateModel, Model
from forge.sampling.sampler import SampleRow, SamplingError, request_seed, sample_each, top_logprobs
from forge.spec.verify import verify_request

log = logging.getLogger("forge.engine.engine")


def failure_message(request_id: str, exc: Exception) -> str:
    """The error a failed request reports: a SamplingError's own words; for anything else only its
    type (the traceback goes to the log, not to the client)."""
    if isinstance(exc, SamplingError):
        return f"request {request_id}: {exc}"
    log.error("request %s failed while sampling", request_id, exc_info=exc)
    return f"request {request_id}: sampling failed ({type(exc).__name__})"


class ModelRunner(Runner):
    """Owns the KV tensors; one ``execute`` per engine step. Everything it needs of the step is in
    the ``SchedulerOutput`` (its rows' requests included)."""

    def __init__(
        self,
        model: Model,
        backend: KernelBackend,
        num_blocks: int,
        block_size: int,
        seed: int = 0,
        num_cpu_blocks: int = 0,
        max_num_seqs: int = 256,
        max_model_len: int = 4096,
        kv_spec: KVSpec | None = None,
        kv_groups: KVCacheGroups | None = None,
        kv_pages: list[KVLayer] | None = None,
        cpu_kv_caches: list[KVLayer] | None = None,
    ) -> None:
        """``kv_spec``: the KV layout to allocate (the model's own when None). ``kv_groups``: how the
        layers share the pool's pages (``forge.core.kv_groups``; None: one page holds every layer):
        ``num_blocks`` pages of ``layers_per_page`` K/V tensors, layer l on tensor ``layer_slot[l]``.
        ``kv_pages`` / ``cpu_kv_caches``: the pool's and the swap space's tensors when the caller
        holds them already (a ``SimulationRunner``'s host store, viewed), instead of allocating."""
        self.model = model
        self.backend = backend
        self.block_size = block_size
        self.seed = seed
        # what embedding requests need (``Engine.add_request`` refuses them without it)
        self.hidden_model: HiddenStateModel | None = model if isinstance(model, HiddenStateModel) else None
        spec = kv_spec or model.kv_spec
        self.kv_groups = kv_groups if kv_groups is not None and kv_groups.is_hybrid else None
        page = spec if self.kv_groups is None else dataclasses.replace(spec, num_layers=self.kv_groups.layers_per_page)
        # The pool's tensors (one K/V pair per layer of a page) and each layer's view of them.
        self.kv_pages: list[KVLayer] = (
            kv_pages if kv_pages is not None else backend.allocate_kv_cache(page, num_blocks, block_size)
        )
        self.kv_caches: list[KVLayer] = (
            self.kv_pages if self.kv_groups is None else [self.kv_pages[s] for s in self.kv_groups.layer_slot]
        )
        # The backend decides how the forward runs (eager, or e.g. replaying CUDA graphs); several
        # groups' tables run eagerly (a captured graph holds one table per row).
        if self.kv_groups is None or self.kv_groups.num_groups == 1:
            max_blocks = -(-max_model_len // block_size)
            self.forward = backend.model_forward(model, self.kv_caches, max_num_seqs, max_blocks)
        else:
            self.forward = lambda batch: model.forward(batch, self.kv_caches, backend)
        # The swap space: the same layout in host memory.
        shape, dtype = spec.cache_shape(num_cpu_blocks, block_size), spec.torch_dtype()
        self.cpu_kv_caches: list[KVLayer] = (
            cpu_kv_caches
            if cpu_kv_caches is not None
            else [
                (torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype))
                for _ in range(page.num_layers if num_cpu_blocks else 0)
            ]
        )

    def apply_block_ops(self, sched: SchedulerOutput) -> None:
        """The step's KV copies, before its forward: swap-out, copy-on-write, swap-in."""
        self.backend.copy_blocks(self.kv_pages, self.cpu_kv_caches, sched.swap_out)
        self.backend.copy_blocks(self.kv_pages, self.kv_pages, sched.copy_blocks)
        self.backend.copy_blocks(self.cpu_kv_caches, self.kv_pages, sched.swap_in)

    def request_seed(self, request: Request) -> int:
        return request_seed(request.sampling_params.seed, self.seed, request.request_id)

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        """Run the batch; sample one token per sampling request, or verify its drafts; pool the
        final hidden states of embedding requests' chunks (``ModelOutput.pooled``).

        A request whose constraint, sampling or verification raises is reported in
        ``ModelOutput.failed`` and the others' tokens are unaffected; an exception from the model
        step itself (or the KV copies) propagates: the step produced nothing."""
        pooling = PoolingRows.of(sched)
        if pooling is None:
            return self.sample(sched, self.forward_logits(sched))
        # embedding requests in the step: the model's final hidden states of their rows too (eagerly)
        if self.hidden_model is None:
            raise TypeError(f"{type(self.model).__name__} gives no hidden states: it cannot serve embeddings")
        self.apply_block_ops(sched)
        batch = build_forward_batch(sched, self.block_size, self.backend.device, self.kv_groups)
        rows = torch.tensor(pooling.rows, dtype=torch.long, device=self.backend.device)
        logits, hidden = self.hidden_model.forward_hidden(batch, self.kv_caches, self.backend, rows)
        return dataclasses.replace(self.sample(sched, logits), pooled=pooling.pooled(hidden))

    @torch.inference_mode()
    def forward_logits(self, sched: SchedulerOutput) -> torch.Tensor:
        """The step's KV copies and forward: the logits of the batch's ``logits_indices`` rows."""
        self.apply_block_ops(sched)
        return self.forward(build_forward_batch(sched, self.block_size, self.backend.device, self.kv_groups))

    def close(self) -> None:
        """Release what outlives the runner's memory (other processes); nothing for one process."""

    def sample(self, sched: SchedulerOutput, logits: torch.Tensor) -> ModelOutput:
        """Tokens from the step's logits (one row per sampling row, one more per draft token)."""
        rows: list[SampleRow] = []
        owners: list[str] = []
        row_of: list[int] = []
        sampled: dict[str, list[int]] = {}
        logprobs: dict[str, list[dict[int, float]]] = {}
        failed: dict[str, str] = {}
        offset = 0
        for s, r in zip(sched.scheduled, sched.requests, strict=True):
            if not s.sample:
                continue
            rid = s.request_id
            n = s.num_draft_tokens
            try:  # a failure here (a constraint's mask, verification) is this request's alone
                if n:
                    sampled[rid], lps = verify_request(
                        logits[offset : offset + n + 1], r, self.request_seed(r), r.spec_token_ids[:n]
                    )
                    if lps is not None:
                        logprobs[rid] = lps
                else:
                    allowed = r.constraint.allowed_mask(logits.shape[-1]) if r.constraint is not None else None
                    if allowed is not None and allowed.device != logits.device:
                        allowed = allowed.to(logits.device)
                    rows.append(
                        SampleRow(
                            r.sampling_params,
                            self.request_seed(r),
                            r.num_tokens,
                            r.prompt_token_ids,
                            r.output_token_ids,
                            allowed,
                        )
                    )
                    owners.append(rid)
                    row_of.append(offset)
            except Exception as exc:
                failed[rid] = failure_message(rid, exc)
            offset += n + 1
        prompt_logprobs, prompt_ranks = (
            self.prompt_logprobs(sched, logits[offset:]) if logits.shape[0] > offset else ({}, {})
        )
        plain = (
            logits
            if offset == len(rows) == logits.shape[0]
            else logits[torch.tensor(row_of, dtype=torch.long, device=logits.device)]
        )
        for i, (rid, row, token) in enumerate(zip(owners, rows, sample_each(plain, rows), strict=True)):
            if isinstance(token, Exception):
                failed[rid] = failure_message(rid, token)
                continue
            sampled[rid] = [token]
            if row.params.logprobs is not None:
                logprobs[rid] = [top_logprobs(plain[i], token, row.params.logprobs)]
        return ModelOutput(sampled, logprobs, failed=failed, prompt_logprobs=prompt_logprobs, prompt_ranks=prompt_ranks)

    @staticmethod
    def prompt_logprobs(
        sched: SchedulerOutput, logits: torch.Tensor
    ) -> tuple[dict[str, list[dict[int, float]]], dict[str, list[int]]]:
        """Per chunk with prompt-logprob rows (``logits``: those rows, in row order): each row's next
        prompt token's logprob plus the request's top-k (raw model distribution), and that token's
        rank (vLLM's: the number of tokens at least as likely as it)."""
        out: dict[str, list[dict[int, float]]] = {}
        ranks: dict[str, list[int]] = {}
        lp = torch.log_softmax(logits.float(), dim=-1)
        row = 0
        for s, r in zip(sched.scheduled, sched.requests, strict=True):
            n = s.num_prompt_logprob_rows
            if not n:
                continue
            k = r.sampling_params.prompt_logprobs or 0
            rows = lp[row : row + n]
            targets = r.prompt_token_ids[s.start + 1 : s.start + 1 + n]
            picked = rows.gather(1, torch.tensor(targets, device=rows.device).unsqueeze(1))
            ranks[s.request_id] = (rows >= picked).sum(dim=-1).tolist()
            chosen = picked.squeeze(1).tolist()
            entries = [{t: v} for t, v in zip(targets, chosen, strict=True)]
            if k:
                vals, ids = rows.topk(k, dim=-1)
                for e, vs, ts in zip(entries, vals.tolist(), ids.tolist(), strict=True):
                    e.update(zip(ts, vs, strict=True))
            out[s.request_id] = entries
            row += n
        return out, ranks
