"""Seeded workloads: when requests arrive and how long their prompts and outputs are."""

from __future__ import annotations

import itertools
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from forge.tokenizers.base import Tokenizer


class RequestSpec(NamedTuple):
    """One request a workload gives: its id, arrival (seconds from the start), prompt, output length
    (``max_tokens``) and priority. (A named tuple: a million are built in a third of a frozen
    dataclass's time.)"""

    request_id: str
    arrival_time: float
    prompt_token_ids: list[int]
    output_len: int
    priority: int = 0


class LengthDist(ABC):
    @abstractmethod
    def sample(self, rng: random.Random) -> int: ...


@dataclass(frozen=True)
class Fixed(LengthDist):
    value: int

    def __post_init__(self) -> None:
        if self.value < 1:
            raise ValueError(f"workload length must be >= 1, got {self.value}")

    def sample(self, rng: random.Random) -> int:
        return self.value


@dataclass(frozen=True)
class Uniform(LengthDist):
    low: int
    high: int

    def __post_init__(self) -> None:
        if not 1 <= self.low <= self.high:
            raise ValueError(f"workload uniform lengths need 1 <= low <= high, got {self.low}..{self.high}")

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def clipped_lognormal_mean(mu: float, sigma: float, low: float, high: float) -> float:
    """E[min(max(X, low), high)] for X ~ LogNormal(mu, sigma), in closed form."""
    la, lb = math.log(low), math.log(high)
    body = math.exp(mu + sigma**2 / 2) * (_phi((lb - mu - sigma**2) / sigma) - _phi((la - mu - sigma**2) / sigma))
    return body + low * _phi((la - mu) / sigma) + high * (1.0 - _phi((lb - mu) / sigma))


@dataclass(frozen=True)
class LogNormal(LengthDist):
    """Lengths ``round(clip(X, low, high))`` with X log-normal of log-std ``sigma``, its location
    solved (bisection on the closed-form clipped mean) so the clipped lengths average ``mean``.

    The ShareGPT-like and Alpaca-like workloads use it with the means of the vLLM paper
    (Fig. 11): ShareGPT input 161.31 / output 337.99, Alpaca 19.31 / 58.45 tokens."""

    mean: float
    sigma: float = 1.0
    low: int = 4
    high: int = 1024
    mu: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        if not 1 <= self.low < self.high:
            raise ValueError(f"workload lognormal lengths need 1 <= low < high, got {self.low}..{self.high}")
        if not self.low < self.mean < self.high:
            raise ValueError(f"workload lognormal mean must lie in ({self.low}, {self.high}), got {self.mean}")
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"workload lognormal sigma must be a finite number > 0, got {self.sigma}")
        lo, hi = math.log(self.low) - 10 * self.sigma, math.log(self.high) + 10 * self.sigma
        for _ in range(200):
            mid = (lo + hi) / 2
            if clipped_lognormal_mean(mid, self.sigma, self.low, self.high) < self.mean:
                lo = mid
            else:
                hi = mid
        object.__setattr__(self, "mu", (lo + hi) / 2)

    def sample(self, rng: random.Random) -> int:
        x = rng.lognormvariate(self.mu, self.sigma)
        return int(min(max(round(x), self.low), self.high))


class Arrivals(ABC):
    """Inter-arrival gaps in seconds. The first request arrives one gap after t=0.

    A workload draws the gaps of one run from ``stream(rng)``: by default the workload's own seeded
    stream, or a stream the arrival process seeds itself (to reproduce another simulator's arrivals
    exactly); ``stream`` is called once per run, before the first ``gap``."""

    @abstractmethod
    def gap(self, rng: random.Random) -> float: ...

    def stream(self, workload_rng: random.Random) -> random.Random:
        return workload_rng


@dataclass(frozen=True)
class AllAtOnce(Arrivals):
    def gap(self, rng: random.Random) -> float:
        return 0.0


@dataclass(frozen=True)
class Poisson(Arrivals):
    rate: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"workload.arrivals.rate must be a finite number > 0 req/s, got {self.rate}")

    def gap(self, rng: random.Random) -> float:
        return rng.expovariate(self.rate)


@dataclass(frozen=True)
class Gamma(Arrivals):
    """Gamma inter-arrivals with mean 1/rate; ``burstiness`` is the shape (1 = Poisson, < 1 burstier),
    as in ``vllm bench serve --burstiness``."""

    rate: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if not all(math.isfinite(x) and x > 0 for x in (self.rate, self.burstiness)):
            raise ValueError(
                f"workload.arrivals needs a finite rate > 0 and burstiness > 0, got {self.rate}, {self.burstiness}"
            )

    def gap(self, rng: random.Random) -> float:
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))


class Workload(ABC):
    """``ignore_eos``: requests run to their drawn output length (the usual benchmark setting).

    ``requests(tokenizer, max_prompt_len)``: the run's requests; with ``max_prompt_len``, a prompt
    longer than it (drawn or listed) raises ValueError naming the request before its tokens are drawn
    (the engine could never run it, and a huge length would take the process's memory)."""

    ignore_eos: bool = True

    @abstractmethod
    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]: ...


def check_prompt_len(request_id: str, n: int, max_prompt_len: int | None) -> None:
    """``Workload.requests``' bound: ValueError if the prompt of ``n`` tokens is longer than ``max_prompt_len``."""
    if max_prompt_len is not None and n > max_prompt_len:
        raise ValueError(
            f"{request_id}'s prompt of {n} tokens is longer than the {max_prompt_len} the engine takes "
            "(engine.max_model_len - 1): shorten the workload's prompts or raise engine.max_model_len"
        )


class SyntheticWorkload(Workload):
    """``num_requests`` random-token prompts with lengths and arrivals drawn from seeded distributions."""

    def __init__(
        self,
        num_requests: int,
        arrivals: Arrivals,
        input_len: LengthDist,
        output_len: LengthDist,
        seed: int = 0,
        num_priorities: int = 1,
        ignore_eos: bool = True,
    ) -> None:
        if num_requests < 1:
            raise ValueError(f"workload.num_requests must be >= 1, got {num_requests}")
        self.num_requests = num_requests
        self.arrivals = arrivals
        self.input_len = input_len
        self.output_len = output_len
        self.seed = seed
        self.num_priorities = num_priorities
        self.ignore_eos = ignore_eos

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        # One independent stream per attribute: changing the rate (or the priority levels)
        # never changes the prompts or lengths, so sweeps compare like with like.
        arrivals, lengths, tokens, priorities = (random.Random(f"{self.seed}/{k}") for k in range(4))
        # (each stream drawn in request order, so the prompts can be drawn after the lengths, together)
        arrivals = self.arrivals.stream(arrivals)
        gap, input_len, output_len = self.arrivals.gap, self.input_len.sample, self.output_len.sample
        t = 0.0
        times: list[float] = []
        input_lens: list[int] = []
        output_lens: list[int] = []
        for _ in range(self.num_requests):
            t += gap(arrivals)
            times.append(t)
            input_lens.append(input_len(lengths))
            output_lens.append(output_len(lengths))
        longest = max(input_lens, default=0)
        check_prompt_len(f"req-{input_lens.index(longest):06d}" if input_lens else "", longest, max_prompt_len)
        prompts = tokenizer.random_token_id_lists(input_lens, tokens)
        ids = [f"req-{i:06d}" for i in range(self.num_requests)]
        return list(map(RequestSpec, ids, times, prompts, output_lens, self._priorities(priorities)))

    def _priorities(self, rng: random.Random) -> Iterable[int]:
        """Each request's priority, drawn in request order; one level: all 0 (nothing drawn: the
        stream is the priorities' own, so no other draw changes)."""
        if self.num_priorities == 1:
            return itertools.repeat(0, self.num_requests)
        return [rng.randrange(self.num_priorities) for _ in range(self.num_requests)]
