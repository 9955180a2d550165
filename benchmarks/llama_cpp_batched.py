"""llama.cpp decoding N sequences together, as its server and ``llama-batched-bench`` do: one
``llama_batch`` per ``llama_decode`` holding a token of every running sequence (its own sequence id),
one context with ``n_seq_max = N`` and room for all of them in its KV cache, greedy, EOS ignored.

Prefill packs whole prompts into batches of at most ``n_batch`` tokens (logits only for each
prompt's last token); decode then feeds every sequence's last token in one batch per step. ``n_batch``
2048 and ``n_ubatch`` 512 are the values llama.cpp's batched-bench README runs with. Also here: the
F32 / F16 / Q8_0 copies of a GGUF made with llama.cpp's own quantizer (``llama_model_quantize``),
cached next to the source model, so each forge weight format has a like-for-like llama.cpp file.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

N_BATCH = 2048
N_UBATCH = 512
COPY_FTYPES = {"F32": 0, "F16": 1, "Q8_0": 7}  # llama_ftype: LLAMA_FTYPE_ALL_F32, _MOSTLY_F16, _MOSTLY_Q8_0


@dataclass(frozen=True)
class BatchEntry:
    """One token of a ``llama_batch``: its id, position, sequence, and whether its logits are wanted."""

    token: int
    pos: int
    seq: int
    logits: bool


def prefill_chunks(prompts: Sequence[Sequence[int]], n_batch: int) -> list[list[BatchEntry]]:
    """Every prompt's tokens (sequence ``i`` for prompt ``i``) in batches of at most ``n_batch``
    tokens, in order; only each prompt's last token asks for logits."""
    chunks: list[list[BatchEntry]] = [[]]
    for seq, prompt in enumerate(prompts):
        for pos, token in enumerate(prompt):
            if len(chunks[-1]) == n_batch:
                chunks.append([])
            chunks[-1].append(BatchEntry(token, pos, seq, pos == len(prompt) - 1))
    return [c for c in chunks if c]


def decode_entries(last_tokens: Sequence[int], positions: Sequence[int]) -> list[BatchEntry]:
    """One decode step: sequence ``i`` feeds ``last_tokens[i]`` at ``positions[i]``, logits for all."""
    return [BatchEntry(tok, pos, seq, True) for seq, (tok, pos) in enumerate(zip(last_tokens, positions, strict=True))]


def write_batch(batch: Any, entries: Sequence[BatchEntry]) -> None:
    """Fill a ``llama_batch`` (from ``llama_batch_init(capacity, 0, 1)``) with ``entries``: the C
    API's calling convention, a caller-owned buffer written in place."""
    for i, entry in enumerate(entries):
        batch.token[i] = entry.token
        batch.pos[i] = entry.pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = entry.seq
        batch.logits[i] = entry.logits
    batch.n_tokens = len(entries)


@dataclass(frozen=True)
class Generation:
    """Greedy continuations (one list per prompt) and the wall seconds of prefill and decode."""

    tokens: list[list[int]]
    prefill_s: float
    decode_s: float

    @property
    def seconds(self) -> float:
        return self.prefill_s + self.decode_s


class LlamaCppBatched:
    """One llama.cpp model on ``threads`` threads; ``generate`` decodes a set of prompts together."""

    def __init__(self, path: Path, threads: int, kv_unified: bool = True, flash_attn: bool | None = None) -> None:
        """``flash_attn``: None keeps llama.cpp's default (auto: on where the backend has it)."""
        import llama_cpp

        self.lib = llama_cpp
        self.threads = threads
        self.kv_unified = kv_unified
        self.flash_attn = flash_attn
        llama_cpp.llama_backend_init()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0
        self.model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {path}")
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model))

    def close(self) -> None:
        self.lib.llama_model_free(self.model)

    def __enter__(self) -> LlamaCppBatched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _context(self, n_seq: int, n_ctx: int) -> Any:
        params = self.lib.llama_context_default_params()
        params.n_ctx = n_ctx
        params.n_batch = N_BATCH
        params.n_ubatch = N_UBATCH
        params.n_seq_max = n_seq
        params.n_threads = self.threads
        params.n_threads_batch = self.threads
        params.kv_unified = self.kv_unified
        params.no_perf = True
        if self.flash_attn is not None:
            params.flash_attn_type = int(self.flash_attn)  # LLAMA_FLASH_ATTN_TYPE_DISABLED 0, _ENABLED 1
        ctx = self.lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {n_seq} sequences x {n_ctx} tokens")
        return ctx

    def _decode(self, ctx: Any, batch: Any, entries: Sequence[BatchEntry]) -> list[int]:
        """Run ``entries`` through the model; the greedy next token of each entry that asked for logits."""
        import numpy as np

        write_batch(batch, entries)
        if self.lib.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        wanted = sum(e.logits for e in entries)
        if not wanted:
            return []
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(ctx), shape=(wanted, self.n_vocab))
        return [int(t) for t in logits.argmax(axis=1)]

    def generate(self, prompts: Sequence[Sequence[int]], output_len: int) -> Generation:
        """``output_len`` greedy tokens for every prompt, all sequences in one context (EOS ignored)."""
        n_seq = len(prompts)
        n_ctx = n_seq * (max(len(p) for p in prompts) + output_len)
        n_ctx = -(-n_ctx // 256) * 256
        ctx = self._context(n_seq, n_ctx)
        batch = self.lib.llama_batch_init(max(N_BATCH, n_seq), 0, 1)
        try:
            start = time.perf_counter()
            firsts: list[int] = []
            for chunk in prefill_chunks(prompts, N_BATCH):
                firsts += self._decode(ctx, batch, chunk)
            prefilled = time.perf_counter()
            tokens = [[t] for t in firsts]
            positions = [len(p) for p in prompts]
            for _ in range(output_len - 1):
                nexts = self._decode(ctx, batch, decode_entries([t[-1] for t in tokens], positions))
                for seq, token in enumerate(nexts):
                    tokens[seq].append(token)
                positions = [p + 1 for p in positions]
            done = time.perf_counter()
        finally:
            self.lib.llama_batch_free(batch)
            self.lib.llama_free(ctx)
        return Generation(tokens, prefilled - start, done - prefilled)


def llama_cpp_copy(source: Path, kind: str, threads: int = 2) -> Path:
    """``source`` rewritten as ``kind`` (F32, F16 or Q8_0) by llama.cpp's quantizer, quantized tensors
    dequantized first (``allow_requantize``); cached as ``<source dir>/llama-cpp-copies/<stem>.<kind>.gguf``."""
    import llama_cpp

    target = source.parent / "llama-cpp-copies" / f"{source.stem}.{kind}.gguf"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = COPY_FTYPES[kind]
    params.allow_requantize = True
    params.nthread = threads
    try:
        rc = llama_cpp.llama_model_quantize(str(source).encode(), str(partial).encode(), ctypes.byref(params))
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({source} -> {kind}) returned {rc}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
