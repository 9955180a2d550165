"""The ``LLM`` class's requests (a mixin of ``forge.llm.LLM``): prompts and sampling params checked and
built into engine requests (structured output's constraints compiled here, by the configured
``structured`` backend), and the step loop that runs them, turning tokens into text deltas (stop
strings applied by the server's ``ChoiceText``)."""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import default_sampling
from forge.engine.engine import Engine
from forge.llm_outputs import CompletionDelta, Prompts
from forge.sched.fork import output_ids
from forge.tokenizers.none import refuse_text_params

if TYPE_CHECKING:
    from forge.structured.base import StructuredBackend


class LLMRequests:
    """The requests of ``LLM``'s methods and the loop that steps them; the state is the ``LLM``'s
    (``LLM.__init__``)."""

    config: DictConfig
    engine: Engine
    tokenizer: Any
    _ids: itertools.count[int]
    _structured: StructuredBackend | None

    def _prompt_ids(self, prompts: Prompts) -> list[list[int]]:
        """Each prompt's token ids (a prompt is a string or a list of token ids)."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
        batch: list[Any] = [prompts] if single else list(prompts)
        return [self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in batch]

    def _requests(
        self, prompts: Prompts, sampling_params: SamplingParams | Sequence[SamplingParams] | None
    ) -> list[Request]:
        """Every request checked and built (constraints compiled) before any reaches the engine."""
        batch = self._prompt_ids(prompts)
        if sampling_params is None:
            sampling_params = default_sampling(self.config)
        params = (
            [sampling_params] * len(batch) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        )
        if len(params) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params)} sampling params")
        requests = []
        for ids, p in zip(batch, params, strict=True):
            refuse_text_params(self.tokenizer, p.stop, p.structured)
            request = Request(f"llm-{next(self._ids)}", ids, p, arrival_time=0.0)
            if p.structured:
                request.constraint = self._constraint(p, len(ids))
            requests.append(request)
        return requests

    def _constraint(self, params: SamplingParams, prompt_len: int) -> Any:
        from forge.structured.base import ConstraintSpec

        if params.n > 1:
            raise ValueError("structured output (json_schema / regex) takes n = 1; give the prompt n times instead")
        if params.json_schema is not None:
            spec = ConstraintSpec.json_schema(params.json_schema)
        else:
            spec = ConstraintSpec.regex(str(params.regex))
        grammar = self._structured_backend().compile(spec)
        budget = min(params.max_tokens, self.engine.scheduler.limits.max_model_len - prompt_len)
        # a budget below the grammar's shortest output: the constraint steers to a shortest output and the
        # engine cuts it at the budget (finish_reason "length"), as the server, OpenAI and vLLM do
        return grammar.constraint(max(budget, grammar.min_tokens))

    def _structured_backend(self) -> StructuredBackend:
        if self._structured is None:
            from hydra.utils import instantiate

            if self.config.get("structured") is None:
                raise ValueError("structured output needs a structured backend (structured=outlines or xgrammar)")
            self._structured = instantiate(self.config.structured)(tokenizer=self.tokenizer)
        return self._structured

    # -- the step loop ---------------------------------------------------------------------------
    def _drive(self, requests: list[Request]) -> Generator[CompletionDelta, None, None]:
        from forge.server.generation import ChoiceText

        choices: dict[str, tuple[int, ChoiceText]] = {}
        for request in requests:
            p = request.sampling_params
            for rid in output_ids(request):
                choices[rid] = (len(choices), ChoiceText(self.tokenizer, list(p.stop), p.stop_token_ids))
        now = self.engine.clock.now()
        for request in requests:
            request.arrival_time = now
            self.engine.add_request(request)
        running = set(choices)
        try:
            while running:
                if not self.engine.has_unfinished():
                    raise RuntimeError(f"the engine finished without {sorted(running)}")
                for out in self.engine.step():
                    if out.request_id not in running:
                        continue
                    index, choice = choices[out.request_id]
                    delta = choice.push(out)
                    done = out.finished or delta.finish_reason is not None
                    if done:
                        running.discard(out.request_id)
                        if not out.finished:  # a stop string ended it: the engine would go on
                            self.engine.abort(out.request_id)
                    yield CompletionDelta(index, out.request_id, delta.text, delta.token_ids, delta.finish_reason)
        finally:
            for rid in running:
                self.engine.abort(rid)
        self.engine.check_idle()
