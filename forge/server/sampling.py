"""A body's sampling fields as the engine's ``SamplingParams`` (one per sequence), and the checks of
those fields that the body's own types cannot make."""

from __future__ import annotations

from dataclasses import dataclass

from forge.core.sampling_params import SamplingParams
from forge.server.checks import check_range, check_token_ids
from forge.server.protocol import APIError, SamplingFields

MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries


def logit_bias(body: SamplingFields, vocab_size: int) -> dict[int, float]:
    """``logit_bias`` with its keys (token ids as strings, OpenAI's form) checked and parsed."""
    raw = body.logit_bias or {}
    if len(raw) > MAX_LOGIT_BIAS:
        raise APIError(f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens", param="logit_bias")
    bad = [key for key in raw if not (key.isascii() and key.isdigit()) or len(key) > 20]
    if bad:  # every one named (the first 8), so that one 400 is enough to fix them all
        keys = ", ".join(repr(key[:32]) for key in bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
        raise APIError(f"logit_bias key{'s' if len(bad) > 1 else ''} {keys}: not token ids", param="logit_bias")
    out = {int(key): bias for key, bias in raw.items()}
    check_token_ids(list(out), vocab_size, "logit_bias")
    return out


def check_sampling_fields(body: SamplingFields, vocab_size: int) -> None:
    """400 naming the first sampling field out of its range."""
    check_range("temperature", body.temperature, 0.0, 2.0)
    check_range("top_p", body.top_p, 0.0, 1.0, low_open=True)
    check_range("min_p", body.min_p, 0.0, 1.0)
    check_range("presence_penalty", body.presence_penalty, -2.0, 2.0)
    check_range("frequency_penalty", body.frequency_penalty, -2.0, 2.0)
    check_range("repetition_penalty", body.repetition_penalty, 0.0, 10.0, low_open=True)
    if body.top_k is not None and body.top_k < -1:
        raise APIError(f"top_k={body.top_k} must be -1 (off), 0 (off) or positive", param="top_k")
    logit_bias(body, vocab_size)


@dataclass(frozen=True)
class Sampling:
    """What every sequence of one request shares; ``params`` makes each one's ``SamplingParams``."""

    body: SamplingFields
    logprobs: int | None
    prompt_logprobs: int | None
    logit_bias: dict[int, float]

    def params(self, max_tokens: int, sequence: int) -> SamplingParams:
        """Sequence ``sequence``'s (it samples with ``seed + sequence``); 400 for what the engine refuses."""
        b = self.body
        try:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=1.0 if b.temperature is None else b.temperature,
                top_k=b.top_k if b.top_k is not None and b.top_k > 0 else 0,
                top_p=1.0 if b.top_p is None else b.top_p,
                min_p=b.min_p or 0.0,
                seed=None if b.seed is None else b.seed + sequence,
                stop_token_ids=list(b.stop_token_ids or []),
                ignore_eos=b.ignore_eos,
                presence_penalty=b.presence_penalty,
                frequency_penalty=b.frequency_penalty,
                repetition_penalty=b.repetition_penalty,
                logprobs=self.logprobs,
                prompt_logprobs=self.prompt_logprobs,
                logit_bias=self.logit_bias,
            )
        except ValueError as exc:
            raise APIError(str(exc)) from exc


def ending_ids(body: SamplingFields, eos_token_ids: frozenset[int]) -> frozenset[int]:
    """The tokens that end a sequence: its stop token ids, and EOS unless ``ignore_eos``."""
    return frozenset(body.stop_token_ids or []) | (frozenset() if body.ignore_eos else frozenset(eos_token_ids))
