"""Vidur's Poisson arrivals, reproduced draw for draw, so forge can replay the requests a Vidur run saw."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from forge.workloads.synthetic import Arrivals

VIDUR_DEFAULT_SEED = 42  # vidur/config/config.py: BaseRequestGeneratorConfig.seed


@dataclass(frozen=True)
class VidurPoisson(Arrivals):
    """The arrival times of Vidur's synthetic request generator with its Poisson interval generator
    (microsoft/vidur, vidur/request_generator/poisson_request_interval_generator.py and
    synthetic_request_generator.py):

    - the generator calls ``random.seed(seed)`` (Python's global Mersenne Twister; vidur/utils/random.py)
      and then draws one interval per request, in order; fixed request lengths draw nothing;
    - an interval is ``-log(1 - random()) / qps``, **capped at 3 / qps** (its ``max_interval``), so the mean
      gap is ``(1 - e**-3) / qps``: Vidur offers 5.2% more load than a Poisson process of rate ``qps``;
    - the first request arrives one interval after t=0.

    Here the gaps come from ``random.Random(seed)``, the same generator and seeding as ``random.seed``, so
    ``rate`` = Vidur's ``qps`` and ``seed`` = its ``request_generator_config.seed`` (default 42) give
    Vidur's arrival times exactly. The workload's own seed does not move them."""

    rate: float
    seed: int = VIDUR_DEFAULT_SEED

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and self.rate > 0):
            raise ValueError(f"workload.arrivals.rate must be a finite number > 0 req/s, got {self.rate}")

    def stream(self, workload_rng: random.Random) -> random.Random:
        return random.Random(self.seed)

    def gap(self, rng: random.Random) -> float:
        # Vidur's max_interval: std * 3.0, std = 1.0 / qps (not always 3.0 / qps: 0.30000000000000004 at qps 10)
        return min(-math.log(1.0 - rng.random()) / self.rate, 1.0 / self.rate * 3.0)
