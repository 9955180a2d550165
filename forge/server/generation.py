"""From an API body to engine requests (every rule checked before anything reaches the engine),
and from engine outputs back to text: incremental detokenization, stop strings (never emitted,
with text that could be the start of one held back), stop token ids, and logprobs."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from forge.core.beam_params import BeamSearchParams
from forge.core.outputs import RequestOutput
from forge.core.request import Request, TokenConstraint
from forge.core.sampling_params import SEED_MAX, SamplingParams
from forge.sched.fork import output_ids
from forge.server.chat_messages import template_messages
from forge.server.guided import guided_specs
from forge.server.min_tokens import MinTokensConstraint
from forge.server.protocol import APIError, ChatCompletionRequest, CompletionRequest, SamplingFields
from forge.server.stops import StopMatcher
from forge.structured.base import ConstraintSpec, Grammar, GrammarError
from forge.structured.compile_pool import CompileBusy, CompilePool
from forge.tokenizers.base import IncrementalDetokenizer, Tokenizer

MAX_CHOICES = 256
MAX_STOP_STRINGS = 16
MAX_ECHOED_NAME = 64
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


@dataclass(frozen=True)
class EngineLimits:
    """What the front end checks against (read once from the engine at startup)."""

    max_model_len: int
    kv_capacity_tokens: int
    vocab_size: int


@dataclass
class ChoiceSpec:
    index: int
    prompt_index: int
    prompt_ids: list[int]
    prompt_text: str | None
    params: SamplingParams
    stop_strings: list[str]
    priority: int
    grammar: Grammar | None
    min_tokens: int = 0
    ending_ids: frozenset[int] = frozenset()
    include_stop_str: bool = False

    beam: BeamSearchParams | None = None  # one of a beam search's results (the search is one request)

    @property
    def forkable(self) -> bool:
        """Sampled with no per-sequence state beyond its seed (no constraint, no prompt logprobs):
        it may be a fork of a sibling over the same prompt (``SamplingParams.n``)."""
        return self.grammar is None and not self.min_tokens and self.params.prompt_logprobs is None

    def to_request(self, request_id: str, n: int = 1) -> Request:
        """The engine request of this choice (``n > 1``: and its ``n - 1`` forked siblings, which
        sample with ``seed + i`` as the choices after it do)."""
        constraint: TokenConstraint | None = None
        if self.grammar is not None:
            constraint = self.grammar.constraint(self.params.max_tokens)
        elif self.min_tokens:
            constraint = MinTokensConstraint(self.min_tokens, self.ending_ids)
        return Request(
            request_id=request_id,
            prompt_token_ids=list(self.prompt_ids),
            sampling_params=dataclasses.replace(self.params, n=n) if n > 1 else self.params,
            priority=self.priority,
            constraint=constraint,
            beam_search=self.beam,
        )


def engine_requests(choices: list[ChoiceSpec], prefix: str) -> tuple[list[Request], dict[str, ChoiceSpec]]:
    """The engine requests behind ``choices`` (in order, a prompt's consecutively) and the choice of
    each of their output ids (``output_ids``). A prompt's sampled choices are one request with
    ``n`` = their number when they can fork (one prefill, the prompt's KV blocks shared copy-on-write;
    choice j samples with ``seed + j`` either way, so the tokens are those of separate requests); a
    beam search's results are one request."""
    requests: list[Request] = []
    by_id: dict[str, ChoiceSpec] = {}
    i = 0
    while i < len(choices):
        first = choices[i]
        group = [first]
        if first.beam is not None or first.forkable:
            while (
                i + len(group) < len(choices)
                and choices[i + len(group)].prompt_index == first.prompt_index
                and (choices[i + len(group)].beam is not None) == (first.beam is not None)
                and (first.beam is not None or choices[i + len(group)].forkable)
            ):
                group.append(choices[i + len(group)])
        n = 1 if first.beam is not None else len(group)
        request = first.to_request(f"{prefix}-{first.index}", n)
        requests.append(request)
        by_id.update(zip(output_ids(request), group, strict=True))
        i += len(group)
    return requests, by_id


def check_model(model: str | None, served: str) -> None:
    """404 unless ``model`` is the served one (``None``: the served one). The name is echoed
    back cut to ``MAX_ECHOED_NAME`` characters."""
    if model is not None and model != served:
        shown = model if len(model) <= MAX_ECHOED_NAME else model[:MAX_ECHOED_NAME] + "..."
        shown = shown.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate is echoed escaped
        raise APIError(f"The model `{shown}` does not exist.", 404, "NotFoundError", "model", "model_not_found")


def _unencodable(value: Any, path: str) -> str | None:
    """The path of the first string in ``value`` that is not valid Unicode (a lone surrogate
    from a ``\\ud800`` escape cannot be encoded to UTF-8, so no tokenizer can take it)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path
        return None
    if isinstance(value, BaseModel):
        fields = [(info.alias or name, getattr(value, name)) for name, info in type(value).model_fields.items()]
        items: Any = [*fields, *(value.model_extra or {}).items()]
    elif isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        if all(type(x) is int for x in value):  # token ids: no per-item call
            return None
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        key_path = _unencodable(key, path or "body") if isinstance(key, str) else None
        found = key_path or _unencodable(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def check_encodable(body: BaseModel) -> None:
    """400 if any text in the body (prompt, messages, stop, schema, ...) is not valid Unicode."""
    path = _unencodable(body, "")
    if path is not None:
        raise APIError(f"{path} contains text that is not valid Unicode (a lone surrogate)", param=path)


def _check_range(name: str, value: float | None, low: float, high: float, low_open: bool = False) -> None:
    if value is None:
        return
    if value < low or value > high or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise APIError(f"{name}={value} is out of range {bound}", param=name)


class RequestBuilder:
    """Validates a body and turns it into ``ChoiceSpec``s (one per engine request)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        limits: EngineLimits,
        structured: CompilePool | None,
        model_name: str,
        max_n: int,
        max_logprobs: int,
        max_stop_len: int = 1024,
    ) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.structured = structured
        self.model_name = model_name
        self.max_n = max_n
        self.max_logprobs = max_logprobs
        self.max_stop_len = max_stop_len
        self._ids = itertools.count()

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}"

    # -- prompts ------------------------------------------------------------------------
    def completion_prompts(self, body: CompletionRequest) -> list[tuple[list[int], str | None]]:
        p = body.prompt
        if isinstance(p, str):
            items: list[Any] = [p]
        elif p and all(isinstance(x, int) for x in p):
            items = [p]
        else:
            items = list(p)
        if not items:
            raise APIError("prompt must not be empty", param="prompt")
        out: list[tuple[list[int], str | None]] = []
        for item in items:
            if isinstance(item, str):
                if not item:
                    raise APIError("prompt must not be empty", param="prompt")
                ids = self.tokenizer.encode(item)
                out.append((ids, item))
            else:
                ids = [int(t) for t in item]
                self._check_ids(ids, "prompt")
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
        if not body.messages:
            raise APIError("messages must not be empty", param="messages")
        messages = template_messages(body.messages)
        final = messages[-1]["content"].strip()
        if body.continue_final_message:
            if body.add_generation_prompt:
                raise APIError(
                    "continue_final_message needs add_generation_prompt=false", param="continue_final_message"
                )
            if messages[-1]["role"] != "assistant" or not final:
                raise APIError(
                    "continue_final_message needs a final assistant message with text", param="continue_final_message"
                )
        try:
            text = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=body.add_generation_prompt, tools=tools
            )
        except ValueError as exc:
            raise APIError(f"chat template failed: {exc}", param="messages") from exc
        if body.continue_final_message:
            at = text.rfind(final)
            if at < 0:
                raise APIError("the template does not show the final message's text", param="continue_final_message")
            text = text[: at + len(final)]
        has_template = bool(getattr(self.tokenizer, "chat_template", None))
        ids = self.tokenizer.encode(text, add_special_tokens=not has_template)
        if not ids:
            raise APIError("the rendered chat is empty", param="messages")
        return ids, text

    def logit_bias(self, body: SamplingFields) -> dict[int, float]:
        """``logit_bias`` with its keys (token ids as strings, OpenAI's form) checked and parsed."""
        raw = body.logit_bias or {}
        if len(raw) > MAX_LOGIT_BIAS:
            raise APIError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens", param="logit_bias")
        out: dict[int, float] = {}
        for key, bias in raw.items():
            if not (key.isascii() and key.isdigit()) or len(key) > 20:
                raise APIError(f"logit_bias key {key[:32]!r} is not a token id", param="logit_bias")
            out[int(key)] = bias
        self._check_ids(list(out), "logit_bias")
        return out

    def _check_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if not 0 <= t < self.limits.vocab_size]
        if bad:
            raise APIError(f"token id {bad[0]} is outside the vocabulary [0, {self.limits.vocab_size})", param=param)

    # -- everything else ----------------------------------------------------------------
    def check_common(self, body: SamplingFields) -> None:
        check_model(body.model, self.model_name)
        body.check_known_fields()
        check_encodable(body)
        if body.stream_options is not None and not body.stream:
            raise APIError("stream_options needs stream=true", param="stream_options")
        if body.seed is not None and body.seed + body.n - 1 > SEED_MAX:
            raise APIError(f"seed + n - 1 must be at most {SEED_MAX} (choice j samples with seed + j)", param="seed")
        if not 1 <= body.n <= self.max_n:
            raise APIError(f"n={body.n} must be in [1, {self.max_n}]", param="n")
        _check_range("temperature", body.temperature, 0.0, 2.0)
        _check_range("top_p", body.top_p, 0.0, 1.0, low_open=True)
        _check_range("min_p", body.min_p, 0.0, 1.0)
        _check_range("presence_penalty", body.presence_penalty, -2.0, 2.0)
        _check_range("frequency_penalty", body.frequency_penalty, -2.0, 2.0)
        _check_range("repetition_penalty", body.repetition_penalty, 0.0, 10.0, low_open=True)
        if body.top_k is not None and body.top_k < -1:
            raise APIError(f"top_k={body.top_k} must be -1 (off), 0 (off) or positive", param="top_k")
        self.logit_bias(body)
        stops = body.stop_strings()
        if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
            raise APIError(f"stop takes at most {MAX_STOP_STRINGS} non-empty strings", param="stop")
        if any(len(s) > self.max_stop_len for s in stops):
            raise APIError(
                f"each stop string may have at most {self.max_stop_len} characters (server.max_stop_len)", param="stop"
            )
        if body.stop_token_ids:
            self._check_ids(body.stop_token_ids, "stop_token_ids")

    async def grammar(self, body: SamplingFields, tool_spec: ConstraintSpec | None = None) -> Grammar | None:
        """The request's grammar, compiled off the event loop within the structured compile budget
        (``tool_spec``: the one tool_choice required/named imposes)."""
        specs: list[tuple[str, ConstraintSpec]] = [] if tool_spec is None else [("tool_choice", tool_spec)]
        rf = body.response_format
        if rf is not None and rf.type == "json_object" and rf.schema_ is not None:
            specs.append(("response_format", ConstraintSpec.json_schema(rf.schema_)))
        elif rf is not None and rf.type == "json_object":
            specs.append(("response_format", ConstraintSpec.json_object()))
        elif rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError("response_format json_schema needs json_schema.schema", param="response_format")
            specs.append(("response_format", ConstraintSpec.json_schema(rf.json_schema.schema_)))
        if body.json_schema is not None:
            specs.append(("json_schema", ConstraintSpec.json_schema(body.json_schema)))
        if body.regex is not None:
            specs.append(("regex", ConstraintSpec.regex(body.regex)))
        specs.extend(guided_specs(body))
        if not specs:
            return None
        if len(specs) > 1:
            raise APIError(
                "give at most one structured-output field (response_format, json_schema, regex, guided_json, "
                "guided_regex, guided_choice, structured_outputs)",
                param=specs[1][0],
            )
        param, spec = specs[0]
        if self.structured is None:
            raise APIError("structured output is not configured on this server", param=param)
        try:
            return await self.structured.compile(spec)
        except GrammarError as exc:
            raise APIError(str(exc), param=param) from exc
        except CompileBusy as exc:
            raise APIError(str(exc), 503, "service_unavailable", param=param, code="overloaded") from exc

    async def choices(
        self,
        body: SamplingFields,
        prompts: list[tuple[list[int], str | None]],
        max_tokens: int | None,
        default_max_tokens: int | None,
        logprobs: int | None,
        tool_spec: ConstraintSpec | None = None,
        prompt_logprobs: int | None = None,
        num_sequences: int | None = None,
        beam: BeamSearchParams | None = None,
    ) -> list[ChoiceSpec]:
        """``prompt_logprobs``: the top-k the engine returns per prompt token (``body.prompt_logprobs``,
        or more when the caller also needs them, e.g. completions' ``echo`` with ``logprobs``).
        ``num_sequences``: sequences sampled per prompt (``best_of``; default ``n``); ``beam``: each
        prompt's choices are the results of one beam search (its ``max_tokens`` is replaced by the
        request's)."""
        per_prompt = beam.beam_width if beam is not None else (num_sequences or body.n)
        if len(prompts) * per_prompt > MAX_CHOICES:
            raise APIError(f"{len(prompts)} prompts x {per_prompt} sequences exceeds {MAX_CHOICES}", param="n")
        if logprobs is not None and not 0 <= logprobs <= self.max_logprobs:
            raise APIError(f"logprobs must be in [0, {self.max_logprobs}]", param="logprobs")
        if prompt_logprobs is not None and not 0 <= prompt_logprobs <= self.max_logprobs:
            raise APIError(f"prompt_logprobs must be in [0, {self.max_logprobs}]", param="prompt_logprobs")
        grammar = await self.grammar(body, tool_spec)
        if body.min_tokens and (grammar is not None or body.stop_strings()):
            raise APIError("min_tokens cannot be combined with stop strings or structured output", param="min_tokens")
        logit_bias = self.logit_bias(body)
        ending = frozenset(body.stop_token_ids or []) | (
            frozenset() if body.ignore_eos else frozenset(self.tokenizer.eos_token_ids)
        )
        top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
        L = self.limits
        out: list[ChoiceSpec] = []
        for pi, (ids, text) in enumerate(prompts):
            room = L.max_model_len - len(ids)
            if room < 1:
                raise APIError(
                    f"This model's maximum context length is {L.max_model_len} tokens; the prompt has {len(ids)}.",
                    param="prompt" if isinstance(body, CompletionRequest) else "messages",
                    code="context_length_exceeded",
                )
            n_out = max_tokens if max_tokens is not None else (default_max_tokens or room)
            if n_out < 1:
                raise APIError(f"max_tokens={n_out} must be >= 1", param="max_tokens")
            if max_tokens is not None and len(ids) + n_out > L.max_model_len:
                raise APIError(
                    f"This model's maximum context length is {L.max_model_len} tokens; you requested "
                    f"{len(ids) + n_out} ({len(ids)} in the prompt, {n_out} to generate).",
                    param="max_tokens",
                    code="context_length_exceeded",
                )
            n_out = min(n_out, room)
            if len(ids) + n_out > L.kv_capacity_tokens:
                raise APIError(
                    f"the request may need {len(ids) + n_out} tokens of KV cache; the whole cache holds "
                    f"{L.kv_capacity_tokens}",
                    param="max_tokens",
                )
            if body.min_tokens > n_out:
                raise APIError(f"min_tokens={body.min_tokens} exceeds max_tokens={n_out}", param="min_tokens")
            if grammar is not None and grammar.min_tokens > n_out:
                raise APIError(
                    f"the shortest output matching the format needs {grammar.min_tokens} tokens; max_tokens={n_out}",
                    param="max_tokens",
                )
            if beam is not None and room < 2:
                raise APIError("the prompt leaves no room for a beam search", param="max_tokens")
            # a beam keeps one slot of room for the token it proposes past its last one
            beam_n = None if beam is None else dataclasses.replace(beam, max_tokens=min(n_out, room - 1))
            for j in range(per_prompt):
                seed = None if body.seed is None else body.seed + j
                try:
                    params = SamplingParams(
                        max_tokens=n_out,
                        temperature=1.0 if body.temperature is None else body.temperature,
                        top_k=top_k,
                        top_p=1.0 if body.top_p is None else body.top_p,
                        min_p=body.min_p or 0.0,
                        seed=seed,
                        stop_token_ids=list(body.stop_token_ids or []),
                        ignore_eos=body.ignore_eos,
                        presence_penalty=body.presence_penalty,
                        frequency_penalty=body.frequency_penalty,
                        repetition_penalty=body.repetition_penalty,
                        logprobs=logprobs,
                        prompt_logprobs=prompt_logprobs,
                        logit_bias=logit_bias,
                    )
                except ValueError as exc:
                    raise APIError(str(exc)) from exc
                out.append(
                    ChoiceSpec(
                        index=pi * per_prompt + j,
                        prompt_index=pi,
                        prompt_ids=ids,
                        prompt_text=text,
                        params=params,
                        stop_strings=body.stop_strings(),
                        priority=body.priority,
                        grammar=grammar,
                        min_tokens=body.min_tokens,
                        ending_ids=ending,
                        include_stop_str=body.include_stop_str_in_output,
                        beam=beam_n,
                    )
                )
        return out


@dataclass
class Delta:
    text: str
    token_ids: list[int]
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    # on the choice's first delta when prompt logprobs were asked for (RequestOutput.prompt_logprobs)
    prompt_logprobs: list[dict[int, float] | None] | None = None

    @classmethod
    def merge(cls, parts: list[Delta]) -> Delta:
        """A whole choice as one delta; with no parts the choice ended without output (``abort``)."""
        return cls(
            "".join(d.text for d in parts),
            [t for d in parts for t in d.token_ids],
            [x for d in parts for x in d.logprobs],
            parts[-1].finish_reason if parts else "abort",
            next((d.prompt_logprobs for d in parts if d.prompt_logprobs is not None), None),
        )


class ChoiceText:
    """One choice's text as its tokens arrive. ``push`` returns what may be sent now; a matched
    stop string ends the choice (``finish_reason="stop"``; the caller aborts the request), and is
    part of the text only with ``include_stop_str``."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        stop_strings: list[str],
        stop_token_ids: Sequence[int],
        include_stop_str: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.matcher = StopMatcher(stop_strings) if stop_strings else None
        self.stop_token_ids = set(stop_token_ids)
        self.detok = IncrementalDetokenizer(tokenizer)
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.num_tokens = 0
        self.finish_reason: str | None = None
        self.include_stop_str = include_stop_str

    def push(self, out: RequestOutput) -> Delta:
        new = list(out.new_token_ids)
        self.num_tokens += len(new)
        shown = new
        if out.finished and out.finish_reason == "stop" and new and new[-1] in self.stop_token_ids:
            shown = new[:-1]
        self.ids.extend(shown)
        self.text += self.detok.push(shown)
        if out.finished:
            full = self.tokenizer.decode(self.ids)
            if full.startswith(self.text):
                self.text = full
        text, matched = self._releasable(final=out.finished)
        reason = "stop" if matched else (out.finish_reason if out.finished else None)
        self.finish_reason = reason
        return Delta(text, new, list(out.logprobs or []), reason, out.prompt_logprobs)

    def _releasable(self, final: bool) -> tuple[str, bool]:
        text = self.text
        limit = len(text)
        if self.matcher is not None:
            hit = self.matcher.feed(text[self.matcher.fed :])
            if hit is not None:
                end = hit.start + len(hit.stop) if self.include_stop_str else hit.start
                out = text[self.sent : end]
                self.text = text[:end]
                self.sent = end
                return out, True
            if not final:
                limit = len(text) - self.matcher.hold
        out = text[self.sent : max(limit, self.sent)]
        self.sent = max(self.sent, limit)
        return out, False
