"""Offline use as a library, the way vLLM users do it: ``generate``, ``chat``, ``stream`` and ``embed``.

Text-level options of ``SamplingParams`` are applied in this class, where tokens become text: ``stop``
strings end an output and are never part of its text (its ``token_ids`` keep every generated token,
as vLLM's do); ``json_schema`` / ``regex`` are compiled by the configured ``structured`` backend into
the request's constraint, in this process (a library caller gives its own schemas, so the server's
bounded compile pool is not needed). How requests are built and stepped is ``forge.llm_requests``
(``LLM``'s base class); what the methods return is ``forge.llm_outputs`` (re-exported here)."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from forge.cli import compose_errors_as_config_errors
from forge.config import compose_config
from forge.core.beam_params import BeamSearchParams
from forge.core.outputs import RequestOutput
from forge.core.pooling import PoolingParams
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine, default_pooling
from forge.engine.engine import Engine
from forge.engine.spawn_guard import check_spawn_guard
from forge.frontend import BeamSearchFrontend
from forge.llm_outputs import BeamSearchOutput, BeamSequence, CompletionDelta, CompletionOutput, Message, Prompts
from forge.llm_requests import LLMRequests
from forge.sched.fork import output_ids

if TYPE_CHECKING:
    from forge.structured.base import StructuredBackend

__all__ = [
    "LLM",
    "BeamSearchOutput",
    "BeamSequence",
    "CompletionDelta",
    "CompletionOutput",
    "Message",
    "Prompts",
]


class LLM(LLMRequests):
    """``LLM("model=tiny", "kvcache=naive")`` takes the same overrides as ``python run.py``; one that
    cannot be composed or a setting forge refuses raises ``ConfigError`` with a one-line message (the
    line ``forge run`` prints; ``FORGE_FULL_ERROR=1``: Hydra's own exception)."""

    def __init__(self, *overrides: str) -> None:
        with compose_errors_as_config_errors():  # an unknown option or key: a one-line ConfigError
            self.config = compose_config(list(overrides))
        world = int(self.config.engine.tensor_parallel_size)
        if world > 1:  # before the model loads: ranks are spawned (torch only imported here: a run may need none)
            from forge.engine.tensor_parallel import torchrun_env

            if torchrun_env() is None:
                check_spawn_guard(f"engine.tensor_parallel_size={world}")
        self.engine: Engine = build_engine(self.config)
        self._beams = BeamSearchFrontend(self.engine)  # beam searches, over the engine's plain requests
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()
        self._structured: StructuredBackend | None = None

    def close(self) -> None:
        """Stop what the engine runs outside this process (``engine.tensor_parallel_size > 1``'s ranks)."""
        self.engine.close()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def generate(
        self,
        prompts: Prompts,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order (``n`` consecutive ones for ``SamplingParams.n = n``).
        A prompt is a string or a list of token ids."""
        requests = self._requests(prompts, sampling_params)
        texts: dict[int, list[str]] = {}
        ids: dict[int, list[int]] = {}
        reasons: dict[int, str | None] = {}
        rids: dict[int, str] = {}
        from tqdm import tqdm

        total = sum(len(output_ids(r)) for r in requests)
        with tqdm(total=total, disable=not use_tqdm, unit="req", desc="forge") as bar:
            for delta in self._drive(requests):
                texts.setdefault(delta.index, []).append(delta.text)
                ids.setdefault(delta.index, []).extend(delta.token_ids)
                rids[delta.index] = delta.request_id
                if delta.finish_reason is not None:
                    reasons[delta.index] = delta.finish_reason
                    bar.update(1)
        prompt_of = {rid: r.prompt_token_ids for r in requests for rid in output_ids(r)}
        return [
            CompletionOutput(
                request_id=rids[i],
                prompt_token_ids=prompt_of[rids[i]],
                token_ids=ids[i],
                text="".join(texts[i]),
                finish_reason=reasons.get(i),
            )
            for i in sorted(rids)
        ]

    def stream(
        self, prompts: Prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None
    ) -> Generator[CompletionDelta, None, None]:
        """``generate`` as an iterator of deltas, step by step (text held back while it could be the
        start of a stop string). Closing the iterator early aborts the outputs still running."""
        return self._drive(self._requests(prompts, sampling_params))

    def chat(
        self,
        messages: Sequence[Message] | Sequence[Sequence[Message]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        add_generation_prompt: bool = True,
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """The assistant's reply to one conversation (a list of ``{"role", "content"}`` messages) or
        to each of several, rendered with the model's chat template (a plain transcript for
        tokenizers without one) as the server's ``/v1/chat/completions`` does."""
        single = len(messages) > 0 and isinstance(messages[0], Mapping)
        conversations: list[Any] = [messages] if single else list(messages)
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        prompts = []
        for conversation in conversations:
            text = self.tokenizer.apply_chat_template([dict(m) for m in conversation], add_generation_prompt)
            prompts.append(self.tokenizer.encode(text, add_special_tokens=not has_template))
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def embed(
        self, prompts: Prompts, pooling: PoolingParams | None = None, use_tqdm: bool = False
    ) -> list[list[float]]:
        """One embedding per prompt, in order, as a plain list of floats (the model's hidden size):
        the prompt's final hidden states (after the final norm) pooled as ``pooling`` says (default:
        the ``embedding`` config group, mean-pooled and L2-normalised). Each prompt runs through the
        engine as a prompt-only request that samples nothing. A prompt is a string or token ids."""
        params = pooling if pooling is not None else default_pooling(self.config)
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        batch: list[Any] = [prompts] if single else list(prompts)
        requests = [
            Request(
                f"llm-{next(self._ids)}",
                self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p],
                SamplingParams(max_tokens=1),
                pooling_params=params,
            )
            for p in batch
        ]
        for request in requests:  # every one checked before any reaches the engine
            refusal = self.engine.scheduler.refusal(request)
            if refusal is not None:
                raise ValueError(refusal)
        from tqdm import tqdm

        embeddings: dict[str, list[float]] = {}
        now = self.engine.clock.now()
        try:
            for request in requests:
                request.arrival_time = now
                self.engine.add_request(request)
            with tqdm(total=len(requests), disable=not use_tqdm, unit="req", desc="forge") as bar:
                while len(embeddings) < len(requests):
                    if not self.engine.has_unfinished():
                        raise RuntimeError("the engine finished without every embedding")
                    for out in self.engine.step():
                        if out.embedding is not None:
                            embeddings[out.request_id] = out.embedding
                            bar.update(1)
                        elif out.error is not None:
                            raise RuntimeError(out.error)
        finally:
            for request in requests:
                if request.request_id not in embeddings:
                    self.engine.abort(request.request_id)
        self.engine.check_idle()
        return [embeddings[r.request_id] for r in requests]

    def beam_search(
        self,
        prompts: Prompts,
        beam_width: int,
        max_tokens: int = 16,
        length_penalty: float = 1.0,
        early_stopping: bool = False,
        ignore_eos: bool = False,
    ) -> list[BeamSearchOutput]:
        """A beam search per prompt (``BeamSearchParams`` says how; vLLM's ``LLM.beam_search``), run by
        ``forge.frontend.BeamSearchFrontend``: the beams are plain requests of the engine sharing the
        prompt's and their common prefix's KV blocks."""
        params = BeamSearchParams(beam_width, max_tokens, length_penalty, early_stopping, ignore_eos)
        now = self.engine.clock.now()
        requests = [
            Request(f"llm-{next(self._ids)}", ids, SamplingParams(max_tokens=max_tokens), now, beam_search=params)
            for ids in self._prompt_ids(prompts)
        ]
        finals: dict[str, RequestOutput] = {}
        wanted = {rid for r in requests for rid in output_ids(r)}
        added: list[Request] = []
        beams = self._beams
        try:
            for request in requests:
                beams.add_request(request)
                added.append(request)
            while len(finals) < len(wanted):
                if not beams.has_unfinished():
                    raise RuntimeError(f"the engine finished without {sorted(wanted - finals.keys())}")
                finals.update((o.request_id, o) for o in beams.step() if o.request_id in wanted)
        finally:
            for request in added:
                if request.request_id not in finals:
                    beams.abort(request.request_id)
        beams.check_idle()
        decode = self.tokenizer.decode
        return [
            BeamSearchOutput(
                r.prompt_token_ids,
                [
                    BeamSequence(o.token_ids, decode(o.token_ids), o.cumulative_logprob or 0.0, o.finish_reason or "")
                    for o in (finals[rid] for rid in output_ids(r))
                    if o.cumulative_logprob is not None
                ],
            )
            for r in requests
        ]
