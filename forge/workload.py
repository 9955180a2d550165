"""Seeded workloads: when requests arrive and how long their prompts and outputs are."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass

from forge.tokenizer import Tokenizer


@dataclass(frozen=True)
class RequestSpec:
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


class Arrivals(ABC):
    """Inter-arrival gaps in seconds."""

    @abstractmethod
    def gap(self, rng: random.Random) -> float: ...


@dataclass(frozen=True)
class AllAtOnce(Arrivals):
    def gap(self, rng: random.Random) -> float:
        return 0.0


@dataclass(frozen=True)
class Poisson(Arrivals):
    rate: float

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"workload.arrivals.rate must be > 0 req/s, got {self.rate}")

    def gap(self, rng: random.Random) -> float:
        return rng.expovariate(self.rate)


@dataclass(frozen=True)
class Gamma(Arrivals):
    """Gamma inter-arrivals with mean 1/rate; ``burstiness`` is the shape (1 = Poisson, < 1 burstier),
    as in ``vllm bench serve --burstiness``."""

    rate: float
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.rate <= 0 or self.burstiness <= 0:
            raise ValueError(f"workload.arrivals needs rate > 0 and burstiness > 0, got {self.rate}, {self.burstiness}")

    def gap(self, rng: random.Random) -> float:
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))


class Workload(ABC):
    """``ignore_eos``: requests run to their drawn output length (the usual benchmark setting)."""

    ignore_eos: bool = True

    @abstractmethod
    def requests(self, tokenizer: Tokenizer) -> list[RequestSpec]: ...


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

    def requests(self, tokenizer: Tokenizer) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        t = 0.0
        specs = []
        for i in range(self.num_requests):
            t += self.arrivals.gap(rng)
            n_in = self.input_len.sample(rng)
            specs.append(
                RequestSpec(
                    request_id=f"req-{i:06d}",
                    arrival_time=t,
                    prompt_token_ids=tokenizer.random_token_ids(n_in, rng),
                    output_len=self.output_len.sample(rng),
                    priority=rng.randrange(self.num_priorities),
                )
            )
        return specs
