"""Per-request sampling parameters (the names follow vLLM's SamplingParams)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
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


def _check(name: str, value: float, low: float, high: float, low_open: bool = False) -> None:
    """``value`` finite and in [low, high] (``(low, high]`` when ``low_open``)."""
    inside = math.isfinite(value) and (low < value if low_open else low <= value) and value <= high
    if not inside:
        raise ValueError(f"{name} must be finite and in {'(' if low_open else '['}{low}, {high}], got {value}")


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples its tokens (immutable; ``dataclasses.replace`` derives variants).

    ``temperature == 0`` is greedy; otherwise it lies in [TEMPERATURE_MIN, TEMPERATURE_MAX]. Every
    float is finite and within the module's ranges (checked at construction). Sampled requests
    draw from a generator seeded by ``(seed, position)``, so their tokens never depend on what else is in the batch.
    ``plain_greedy``: greedy with no penalties and no logprobs, so the token is the logits' argmax.

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
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logprobs: int | None = None
    n: int = 1  # parallel sampling: n sequences from one prompt, sharing its KV blocks (forge.sched.fork)
    stop: list[str] = field(default_factory=list)  # strings that end the output (never part of its text)
    json_schema: Mapping[str, Any] | bool | None = None  # the output is JSON matching this schema
    regex: str | None = None  # the output matches this regular expression
    plain_greedy: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Refuses values outside the module's ranges (and NaN/inf) with ValueError."""
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature != 0.0:
            _check("temperature", self.temperature, TEMPERATURE_MIN, TEMPERATURE_MAX)
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
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if self.json_schema is not None and self.regex is not None:
            raise ValueError("give at most one of json_schema and regex")
        object.__setattr__(self, "stop_token_ids", list(self.stop_token_ids))
        object.__setattr__(self, "stop", list(self.stop))
        object.__setattr__(self, "plain_greedy", self.greedy and self.logprobs is None and not self.needs_penalties)

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
