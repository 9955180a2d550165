"""Vidur's synthetic requests, draw for draw (``workload=vidur_synthetic``): its interval generators
(``poisson``, ``gamma``, ``static``) and length generators (``fixed``, ``uniform``, ``zipf``: a total
length split by a prefill:decode ratio), seeded and drawn in the order Vidur draws them, so forge
replays the requests a Vidur run saw (microsoft/vidur, vidur/request_generator/).

Vidur's ``SyntheticRequestGenerator``: ``set_seeds(seed)`` (Python's ``random.seed`` and numpy's
``np.random.seed``), then per request one interval and then one length pair; the requests are sorted
by arrival (stably) and their lengths truncated to ints. Here ``random.Random(seed)`` stands for
Python's global generator and ``np.random.RandomState(seed)`` for numpy's (the same generators, the
same seeding); Zipf draws from its own ``RandomState(lengths.seed)`` as Vidur's ``ZipfGenerator``."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import RequestSpec, Workload, check_prompt_len

INTERVALS = ("poisson", "gamma", "static")
LENGTHS = ("fixed", "uniform", "zipf")
EPS = 1e-8  # vidur/utils/zipf_generator.py


@dataclass(frozen=True)
class VidurIntervals:
    """Vidur's request interval generator: ``poisson`` (exponential gaps capped at 3 / qps, Python's
    generator), ``gamma`` (scipy's ``gamma.rvs`` with shape 1 / cv² and mean 1 / qps, numpy's
    generator) or ``static`` (every request at t = 0)."""

    kind: str = "poisson"
    qps: float = 1.0
    cv: float = 0.5

    def __post_init__(self) -> None:
        if self.kind not in INTERVALS:
            raise ValueError(f"workload.arrivals.kind must be one of {list(INTERVALS)}, got {self.kind!r}")
        for name in ("qps", "cv"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"workload.arrivals.{name} must be a finite number > 0, got {value}")

    def drawer(self, py: random.Random, npr: Any) -> Callable[[], float]:
        qps = self.qps
        if self.kind == "poisson":
            return lambda: min(-math.log(1.0 - py.random()) / qps, 1.0 / qps * 3.0)
        if self.kind == "gamma":
            shape = 1.0 / self.cv**2
            scale = 1.0 / (qps * shape)
            return lambda: float(npr.standard_gamma(shape) * scale + 0.0)  # scipy: standard_gamma * scale + loc
        return lambda: 0.0


@dataclass(frozen=True)
class VidurLengths:
    """Vidur's request length generator: ``fixed`` (``prefill_tokens`` / ``decode_tokens``), or a total
    of ``min_tokens``-``max_tokens`` tokens split as decode = total / (1 + ``prefill_to_decode_ratio``),
    prefill = the rest: ``uniform`` (``random.uniform``, decode rounded up) or ``zipf`` (Vidur's
    ``ZipfGenerator``, exponent ``theta``, its own ``seed``)."""

    kind: str = "fixed"
    prefill_tokens: int = 2048
    decode_tokens: int = 512
    min_tokens: int = 1024
    max_tokens: int = 4096
    prefill_to_decode_ratio: float = 20.0
    theta: float = 0.6
    seed: int = 42

    def __post_init__(self) -> None:
        if self.kind not in LENGTHS:
            raise ValueError(f"workload.lengths.kind must be one of {list(LENGTHS)}, got {self.kind!r}")
        r, theta = self.prefill_to_decode_ratio, self.theta
        if not (math.isfinite(r) and r > 0):
            raise ValueError(f"workload.lengths.prefill_to_decode_ratio (P:D) must be a finite number > 0, got {r}")
        if not (math.isfinite(theta) and theta > 0 and theta != 1):
            raise ValueError(f"workload.lengths.theta (Zipf exponent) must be > 0 and != 1, got {theta}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(
                f"workload.lengths needs 1 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}"
            )

    def drawer(self, py: random.Random) -> Callable[[], tuple[float, float]]:
        ratio = self.prefill_to_decode_ratio
        if self.kind == "fixed":
            fixed = (float(self.prefill_tokens), float(self.decode_tokens))
            return lambda: fixed
        if self.kind == "uniform":

            def uniform() -> tuple[float, float]:
                total = py.uniform(self.min_tokens, self.max_tokens)
                decode = math.ceil(total / (1 + ratio))
                return total - decode, decode

            return uniform
        zipf = ZipfDraws(self.min_tokens, self.max_tokens, self.theta, self.seed)

        def zipf_split() -> tuple[float, float]:
            total = zipf.next()
            decode = total / (1 + ratio)
            return total - decode, decode

        return zipf_split


class ZipfDraws:
    """Vidur's ``ZipfGenerator`` (unscrambled), the same numpy operations in the same order."""

    def __init__(self, low: int, high: int, theta: float, seed: int) -> None:
        import numpy as np

        self.np, self.low, self.items, self.theta = np, low, high - low + 1, theta
        zeta_2 = self._zeta(2)
        self.alpha = 1.0 / (1.0 - theta)
        self.zetan = self._zeta(self.items)
        self.eta = (1 - np.power(2.0 / self.items, 1 - theta)) / (1 - zeta_2 / (self.zetan + EPS))
        self.rng = np.random.RandomState(seed)

    def _zeta(self, count: float) -> Any:
        np = self.np
        return np.sum(1 / (np.power(np.arange(1, count), self.theta)))

    def next(self) -> int:
        np = self.np
        u = self.rng.random_sample()
        uz = u * self.zetan
        if uz < 1.0:
            return self.low
        if uz < 1.0 + np.power(0.5, self.theta):
            return self.low + 1
        return self.low + int(self.items * np.power(self.eta * u - self.eta + 1, self.alpha))


class VidurSyntheticWorkload(Workload):
    """``num_requests`` requests as Vidur's synthetic generator draws them with request-generator seed
    ``seed`` (Vidur's default 42); random-token prompts of the drawn lengths."""

    def __init__(
        self,
        num_requests: int,
        arrivals: VidurIntervals,
        lengths: VidurLengths,
        seed: int = 42,
        ignore_eos: bool = True,
    ) -> None:
        if num_requests < 1:
            raise ValueError(f"workload.num_requests must be >= 1, got {num_requests}")
        self.num_requests, self.arrivals, self.lengths = num_requests, arrivals, lengths
        self.seed, self.ignore_eos = seed, ignore_eos

    def draws(self) -> list[tuple[float, int, int]]:
        """(arrival s, prompt tokens, output tokens) of each request, as Vidur's ``generate()`` returns them."""
        import numpy as np

        py, npr = random.Random(self.seed), np.random.RandomState(self.seed)
        interval, lengths = self.arrivals.drawer(py, npr), self.lengths.drawer(py)
        t, rows = 0.0, []
        for _ in range(self.num_requests):
            t = t + interval()
            prefill, decode = lengths()
            rows.append((t, int(prefill), int(decode)))
        rows.sort(key=lambda row: row[0])
        return rows

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        rows = self.draws()
        for i, (_, prompt, output) in enumerate(rows):
            if prompt < 1 or output < 1:
                raise ValueError(
                    f"workload.lengths drew req-{i:06d} with {prompt} prompt and {output} output tokens (each must be"
                    " >= 1): raise min_tokens or bring prefill_to_decode_ratio nearer 1"
                )
            check_prompt_len(f"req-{i:06d}", prompt, max_prompt_len)
        prompts = tokenizer.random_token_id_lists([p for _, p, _ in rows], random.Random(f"{self.seed}/tokens"))
        return [
            RequestSpec(request_id=f"req-{i:06d}", arrival_time=t, prompt_token_ids=prompts[i], output_len=out)
            for i, (t, _, out) in enumerate(rows)
        ]
