"""Offline use as a library, the way vLLM users do it."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine, default_sampling
from forge.engine.engine import Engine
from forge.sched.fork import sibling_ids


@dataclass(frozen=True)
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None


class LLM:
    """``LLM("model=tiny", "kvcache=naive")`` takes the same overrides as ``python run.py``."""

    def __init__(self, *overrides: str) -> None:
        self.config = compose_config(list(overrides))
        self.engine: Engine = build_engine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._ids = itertools.count()

    def generate(
        self,
        prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
    ) -> list[CompletionOutput]:
        """One output per prompt, in order (``n`` consecutive ones for ``SamplingParams.n = n``).
        A prompt is a string or a list of token ids."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        batch: list[Any] = [prompts] if single else list(prompts)
        if sampling_params is None:
            sampling_params = default_sampling(self.config)
        params = (
            [sampling_params] * len(batch) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        )
        if len(params) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params)} sampling params")
        requests = []
        for prompt, p in zip(batch, params, strict=True):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            requests.append(Request(f"llm-{next(self._ids)}", ids, p, arrival_time=0.0))
        finals = self.engine.run(requests, progress=use_tqdm)
        outputs = []
        for req, rid in ((r, rid) for r in requests for rid in sibling_ids(r)):
            out = finals[rid]
            outputs.append(
                CompletionOutput(
                    request_id=rid,
                    prompt_token_ids=req.prompt_token_ids,
                    token_ids=list(out.token_ids),
                    text=self.tokenizer.decode(out.token_ids),
                    finish_reason=out.finish_reason,
                )
            )
        return outputs
