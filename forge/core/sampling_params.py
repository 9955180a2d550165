"""Per-request sampling parameters (the names follow vLLM's SamplingParams)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# The ranges every path (server, library, workloads) enforces; in them no float32 step of the
# sampler can overflow. Temperature is 0 (greedy) or at least TEMPERATURE_MIN: tinier positive
# values are refused, not clamped (vLLM clamps them to 1e-2).
TEMPERATURE_MIN = 1e-2
TEMPERATURE_MAX = 100.0
PENALTY_MAX = 2.0  # presence/frequency penalties lie in [-PENALTY_MAX, PENALTY_MAX], as OpenAI's
REPETITION_PENALTY_MIN = 1e-2
REPETITION_PENALTY_MAX = 10.0
SEED_MIN = -(1 << 63)
SEED_MAX = (1 << 64) - 1
LOGIT_BIAS_MAX = 100.0  # OpenAI's bound: a bias lies in [-LOGIT_BIAS_MAX, LOGIT_BIAS_MAX]


def _check(name: str, value: float, low: float, high: float, low_open: bool = False, or_zero: bool = False) -> None:
    """``value`` finite and in [low, high] (``(low, high]`` when ``low_open``; 0 too when ``or_zero``)."""
    inside = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not inside and not (or_zero and value == 0.0):
        interval = f"{'(' if low_open else '['}{low}, {high}]"
        raise ValueError(f"{name} must be {'0 or ' if or_zero else ''}finite and in {interval}, got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its tokens (immutable, sequences kept as tuples; ``dataclasses.replace``
    derives variants).

    ``temperature == 0`` is greedy; otherwise it lies in [TEMPERATURE_MIN, TEMPERATURE_MAX]. Every
    float is finite and within the module's ranges (checked at construction). Sampled requests
    draw from a generator seeded by ``(seed, position)``, so their tokens never depend on what else is in the batch.
    ``logit_bias`` maps token ids to a bias added to their logits before anything else (OpenAI's).
    ``plain_greedy``: greedy with no penalties, bias or logprobs, so the token is the logits' argmax.
    ``greedy_to_length``: plain greedy ending only at its length limit (EOS ignored, no stop tokens).
    ``prompt_logprobs``: the request's first output carries, per prompt token, its logprob given the
    tokens before it plus the top-k (None for the first token); such a request computes its whole
    prompt (no prefix-cache hits).

    ``stop``, ``json_schema`` and ``regex`` concern the text, which the engine never sees: the caller
    that turns tokens into text applies them (``forge.llm.LLM`` does: a stop string ends the output and
    is not part of it; a JSON schema or regex is compiled into the request's constraint). The engine
    itself stops only on ``stop_token_ids``, EOS and ``max_tokens``.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    stop_token_ids: Sequence[int] = ()  # kept as a tuple
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    prompt_logprobs: int | None = None  # each prompt token's logprob (given those before it) plus the top-k
    logit_bias: Mapping[int, float] = field(default_factory=dict)  # kept as a read-only view
    n: int = 1  # parallel sampling: n sequences from one prompt, sharing its KV blocks (forge.sched.fork)
    stop: Sequence[str] = ()  # strings that end the output (never part of its text); kept as a tuple
    json_schema: Mapping[str, Any] | bool | None = None  # the output is JSON matching this schema
    regex: str | None = None  # the output matches this regular expression
    plain_greedy: bool = field(init=False, repr=False, compare=False)
    greedy_to_length: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Refuses values outside the module's ranges (and NaN/inf) with ValueError."""
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        _check("temperature", self.temperature, TEMPERATURE_MIN, TEMPERATURE_MAX, or_zero=True)
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        _check("top_p", self.top_p, 0.0, 1.0, low_open=True)
        _check("min_p", self.min_p, 0.0, 1.0)
        _check("presence_penalty", self.presence_penalty, -PENALTY_MAX, PENALTY_MAX)
        _check("frequency_penalty", self.frequency_penalty, -PENALTY_MAX, PENALTY_MAX)
        _check("repetition_penalty", self.repetition_penalty, REPETITION_PENALTY_MIN, REPETITION_PENALTY_MAX)
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be in [{SEED_MIN}, {SEED_MAX}], got {self.seed}")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be >= 0, got {self.logprobs}")
        if self.prompt_logprobs is not None and self.prompt_logprobs < 0:
            raise ValueError(f"prompt_logprobs must be >= 0, got {self.prompt_logprobs}")
        for token, bias in self.logit_bias.items():
            if token < 0:
                raise ValueError(f"logit_bias token ids must be >= 0, got {token}")
            _check("logit_bias", bias, -LOGIT_BIAS_MAX, LOGIT_BIAS_MAX)
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.json_schema is not None and self.regex is not None:
            raise ValueError("give at most one of json_schema and regex")
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "logit_bias", MappingProxyType(dict(self.logit_bias)))
        plain = self.greedy and self.logprobs is None and not self.needs_penalties and not self.logit_bias
        object.__setattr__(self, "plain_greedy", plain)
        object.__setattr__(self, "greedy_to_length", plain and self.ignore_eos and not self.stop_token_ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def structured(self) -> bool:
        """The output must match ``json_schema`` or ``regex``."""
        return self.json_schema is not None or self.regex is not None

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0
