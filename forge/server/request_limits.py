"""The limits a request is held to before it reaches the engine: how many sequences and logprobs it
may ask for, and how many tokens each prompt may generate (the context length, the KV cache's size,
``min_tokens``)."""

from __future__ import annotations

from dataclasses import dataclass

from forge.server.protocol import APIError

MAX_CHOICES = 256


@dataclass(frozen=True)
class EngineLimits:
    """What the front end checks against (read once from the engine at startup)."""

    max_model_len: int
    kv_capacity_tokens: int
    vocab_size: int


def check_counts(
    num_prompts: int, per_prompt: int, logprobs: int | None, prompt_logprobs: int | None, max_logprobs: int
) -> None:
    """400 for more than ``MAX_CHOICES`` sequences in all, or logprobs past ``max_logprobs``."""
    if num_prompts * per_prompt > MAX_CHOICES:
        raise APIError(f"{num_prompts} prompts x {per_prompt} sequences exceeds {MAX_CHOICES}", param="n")
    if logprobs is not None and not 0 <= logprobs <= max_logprobs:
        raise APIError(f"logprobs must be in [0, {max_logprobs}]", param="logprobs")
    if prompt_logprobs is not None and not 0 <= prompt_logprobs <= max_logprobs:
        raise APIError(f"prompt_logprobs must be in [0, {max_logprobs}]", param="prompt_logprobs")


@dataclass(frozen=True)
class OutputRoom:
    """A prompt's generation budget: ``max_tokens`` to generate, ``room`` left in the context."""

    max_tokens: int
    room: int


def output_room(
    limits: EngineLimits, prompt_len: int, max_tokens: int | None, default_max_tokens: int | None, prompt_param: str
) -> OutputRoom:
    """The tokens a prompt of ``prompt_len`` may generate: ``max_tokens`` when given (400 past the
    context), else ``default_max_tokens`` (None: the rest of the context), cut to the context; 400
    when the prompt fills the context or prompt and output may not fit the whole KV cache."""
    room = limits.max_model_len - prompt_len
    if room < 1:
        raise APIError(
            f"This model's maximum context length is {limits.max_model_len} tokens; the prompt has {prompt_len}.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    n_out = max_tokens if max_tokens is not None else (default_max_tokens or room)
    if n_out < 1:
        raise APIError(f"max_tokens={n_out} must be >= 1", param="max_tokens")
    if max_tokens is not None and prompt_len + n_out > limits.max_model_len:
        raise APIError(
            f"This model's maximum context length is {limits.max_model_len} tokens; you requested "
            f"{prompt_len + n_out} ({prompt_len} in the prompt, {n_out} to generate).",
            param="max_tokens",
            code="context_length_exceeded",
        )
    n_out = min(n_out, room)
    if prompt_len + n_out > limits.kv_capacity_tokens:
        raise APIError(
            f"the request may need {prompt_len + n_out} tokens of KV cache; the whole cache holds "
            f"{limits.kv_capacity_tokens}",
            param="max_tokens",
        )
    return OutputRoom(n_out, room)


def check_output_floor(max_tokens: int, min_tokens: int) -> None:
    """400 when ``max_tokens`` is below ``min_tokens``. (A ``max_tokens`` below the shortest output a
    grammar allows is not refused: the output is cut, a prefix of a valid one, as OpenAI and vLLM do.)"""
    if min_tokens > max_tokens:
        raise APIError(f"min_tokens={min_tokens} exceeds max_tokens={max_tokens}", param="min_tokens")
