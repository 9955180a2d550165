"""From an API body to ``ChoiceSpec``s, every rule checked before anything reaches the engine:
the body's common checks, its prompts, then per request limits -> grammar -> sampling params."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from forge.core.beam_params import BeamSearchParams
from forge.core.sampling_params import SEED_MAX
from forge.server.allowed_tokens import allowed_token_ids
from forge.server.chat_messages import template_kwargs, template_messages
from forge.server.checks import check_encodable, check_model, check_token_ids
from forge.server.choices import ChoiceAsk, ChoiceSpec
from forge.server.grammar import request_grammar
from forge.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, SamplingFields
from forge.server.request_limits import EngineLimits, check_counts, check_output_floor, output_room
from forge.server.sampling import Sampling, check_sampling_fields, ending_ids, logit_bias
from forge.server.token_only import check_token_only, needs_tokenizer
from forge.structured.base import Grammar
from forge.structured.compile_pool import CompilePool
from forge.tokenizers.base import Tokenizer
from forge.tokenizers.none import has_text

MAX_STOP_STRINGS = 16
Prompt = tuple[list[int], str | None]  # token ids, and the text they came from (None: given as ids)


def _prompt_items(body: CompletionRequest) -> list[Any]:
    """The body's prompts: one text, one list of ids, or a list of either."""
    p = body.prompt
    if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
        return [p]
    return list(p)


def _beam_for_prompt(beam: BeamSearchParams | None, max_tokens: int, room: int) -> BeamSearchParams | None:
    """A prompt's beam search: a beam keeps one slot of room for the token it proposes past its last one."""
    if beam is None:
        return None
    if room < 2:
        raise APIError("the prompt leaves no room for a beam search", param="max_tokens")
    return dataclasses.replace(beam, max_tokens=min(max_tokens, room - 1))


class RequestBuilder:
    """Validates a body and turns it into ``ChoiceSpec``s (one per returned sequence)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: EngineLimits,
        structured: CompilePool | None,
        model_name: str,
        max_n: int,
        max_logprobs: int,
        max_stop_len: int = 1024,
        chat_template: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.has_text = has_text(tokenizer)  # False: model.tokenizer=none, token ids only
        self.limits = limits
        self.structured = structured
        self.model_name = model_name
        self.max_n = max_n
        self.max_logprobs = max_logprobs
        self.max_stop_len = max_stop_len
        self.chat_template = chat_template  # server.chat_template's text (None: the tokenizer's own)
        self._ids = itertools.count()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    # -- prompts ------------------------------------------------------------------------
    def completion_prompts(self, body: CompletionRequest) -> list[Prompt]:
        items = _prompt_items(body)
        if not items:
            raise APIError("prompt must not be empty", param="prompt")
        out: list[Prompt] = []
        for item in items:
            if isinstance(item, str):
                if not self.has_text:
                    raise needs_tokenizer("a text prompt", "prompt")
                if not item:
                    raise APIError("prompt must not be empty", param="prompt")
                out.append((self.tokenizer.encode(item), item))
            else:
                ids = [int(t) for t in item]
                check_token_ids(ids, self.limits.vocab_size, "prompt")
                out.append((ids, None))
            if not out[-1][0]:
                raise APIError("prompt must not be empty", param="prompt")
        return out

    def chat_prompt(
        self, body: ChatCompletionRequest, tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], str]:
        """The rendered chat (``tools`` given to the template). ``continue_final_message``: the
        final assistant message is left open, to be continued (Hugging Face's rule: the render is
        cut right after that message's text)."""
        if not self.has_text:
            raise needs_tokenizer("a chat", "messages")
        if not body.messages:
            raise APIError("messages must not be empty", param="messages")
        messages = template_messages(body.messages)
        final = messages[-1]["content"].strip()
        if body.continue_final_message:
            _check_continuable(body, messages[-1]["role"], final)
        variables = self.tokenizer.chat_template_variables(self.chat_template)
        kwargs = template_kwargs(body.chat_template_kwargs, variables)
        try:
            text = self.tokenizer.apply_chat_template(
                messages, body.add_generation_prompt, tools, self.chat_template, kwargs
            )
        except ValueError as exc:
            raise APIError(f"chat template failed: {exc}", param="messages") from exc
        if body.continue_final_message:
            at = text.rfind(final)
            if at < 0:
                raise APIError("the template does not show the final message's text", param="continue_final_message")
            text = text[: at + len(final)]
        has_template = bool(self.chat_template or getattr(self.tokenizer, "chat_template", None))
        ids = self.tokenizer.encode(text, add_special_tokens=not has_template)
        if not ids:
            raise APIError("the rendered chat is empty", param="messages")
        return ids, text

    # -- checks -------------------------------------------------------------------------
    def check_common(self, body: SamplingFields) -> None:
        """The checks completions and chat share (the body's fields, before its prompt is read)."""
        check_model(body.model, self.model_name)
        body.check_known_fields()
        check_encodable(body)
        if body.stream_options is not None and not body.stream:
            raise APIError("stream_options needs stream=true", param="stream_options")
        if body.seed is not None and body.seed + body.n - 1 > SEED_MAX:
            raise APIError(f"seed + n - 1 must be at most {SEED_MAX} (choice j samples with seed + j)", param="seed")
        if not 1 <= body.n <= self.max_n:
            raise APIError(f"n={body.n} must be in [1, {self.max_n}]", param="n")
        check_sampling_fields(body, self.limits.vocab_size)
        if not self.has_text:
            check_token_only(body)
        self._check_stops(body)

    def _check_stops(self, body: SamplingFields) -> None:
        stops = body.stop_strings()
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise APIError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop")
        if any(len(s) > self.max_stop_len for s in stops):
            raise APIError(
                f"each stop string may have at most {self.max_stop_len} characters (server.max_stop_len)", param="stop"
            )
        if body.stop_token_ids:
            check_token_ids(body.stop_token_ids, self.limits.vocab_size, "stop_token_ids")

    # -- choices ------------------------------------------------------------------------
    async def choices(self, body: SamplingFields, prompts: list[Prompt], ask: ChoiceAsk) -> list[ChoiceSpec]:
        """The choices of ``body`` over ``prompts``: limits -> grammar -> sampling params, per prompt."""
        per_prompt = ask.per_prompt(body.n)
        check_counts(len(prompts), per_prompt, ask.logprobs, ask.prompt_logprobs, self.max_logprobs)
        grammar = await request_grammar(body, ask.tool_spec, self.structured)
        if body.min_tokens and grammar is not None:
            raise APIError("min_tokens cannot be combined with structured output", param="min_tokens")
        if body.allowed_token_ids is not None and grammar is not None:
            raise APIError("allowed_token_ids cannot be combined with structured output", param="allowed_token_ids")
        sampling = Sampling(body, ask.logprobs, ask.prompt_logprobs, logit_bias(body, self.limits.vocab_size))
        out: list[ChoiceSpec] = []
        for pi, prompt in enumerate(prompts):
            out += self._prompt_choices(body, pi, prompt, ask, grammar, sampling)
        return out

    def _prompt_choices(
        self, body: SamplingFields, pi: int, prompt: Prompt, ask: ChoiceAsk, grammar: Grammar | None, sampling: Sampling
    ) -> list[ChoiceSpec]:
        ids, text = prompt
        prompt_param = "prompt" if isinstance(body, CompletionRequest) else "messages"
        budget = output_room(self.limits, len(ids), ask.max_tokens, ask.default_max_tokens, prompt_param)
        check_output_floor(budget.max_tokens, body.min_tokens)
        beam = _beam_for_prompt(ask.beam, budget.max_tokens, budget.room)
        per_prompt = ask.per_prompt(body.n)
        ending = ending_ids(body, self.tokenizer.eos_token_ids)
        allowed = allowed_token_ids(body, self.limits.vocab_size, ending)
        return [
            ChoiceSpec(
                index=pi * per_prompt + j,
                prompt_index=pi,
                prompt_ids=ids,
                prompt_text=text,
                params=sampling.params(budget.max_tokens, j),
                stop_strings=body.stop_strings(),
                priority=body.priority,
                grammar=grammar,
                min_tokens=body.min_tokens,
                ending_ids=ending,
                include_stop_str=body.include_stop_str_in_output,
                beam=beam,
                allowed_ids=allowed,
            )
            for j in range(per_prompt)
        ]


def _check_continuable(body: ChatCompletionRequest, role: str, final: str) -> None:
    """``continue_final_message`` needs no generation prompt and a final assistant message with text."""
    if body.add_generation_prompt:
        raise APIError("continue_final_message needs add_generation_prompt=false", param="continue_final_message")
    if role != "assistant" or not final:
        raise APIError(
            "continue_final_message needs a final assistant message with text", param="continue_final_message"
        )
