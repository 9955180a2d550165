"""Many requests over a few long shared prompts: the workload prefix caching is for."""

from __future__ import annotations

import random

from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import Arrivals, LengthDist, RequestSpec, Workload, check_prompt_len


class SharedPrefixWorkload(Workload):
    """Each prompt is one of ``num_prefixes`` seeded system prompts of ``prefix_len`` tokens followed
    by a fresh random suffix. Prefix ``i`` is drawn with weight ``1 / (i + 1) ** zipf`` (0 = uniform)."""

    def __init__(
        self,
        num_requests: int,
        arrivals: Arrivals,
        num_prefixes: int,
        prefix_len: int,
        suffix_len: LengthDist,
        output_len: LengthDist,
        seed: int = 0,
        zipf: float = 0.0,
        num_priorities: int = 1,
        ignore_eos: bool = True,
    ) -> None:
        if num_requests < 1:
            raise ValueError(f"workload.num_requests must be >= 1, got {num_requests}")
        if num_prefixes < 1 or prefix_len < 1:
            raise ValueError(f"workload needs num_prefixes >= 1 and prefix_len >= 1, got {num_prefixes}, {prefix_len}")
        if zipf < 0:
            raise ValueError(f"workload.zipf must be >= 0, got {zipf}")
        self.num_requests = num_requests
        self.arrivals = arrivals
        self.num_prefixes = num_prefixes
        self.prefix_len = prefix_len
        self.suffix_len = suffix_len
        self.output_len = output_len
        self.seed = seed
        self.zipf = zipf
        self.num_priorities = num_priorities
        self.ignore_eos = ignore_eos

    def requests(self, tokenizer: Tokenizer, max_prompt_len: int | None = None) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        check_prompt_len("every request", self.prefix_len, max_prompt_len)
        prefixes = [tokenizer.random_token_ids(self.prefix_len, rng) for _ in range(self.num_prefixes)]
        weights = [1.0 / (i + 1) ** self.zipf for i in range(self.num_prefixes)]
        gaps = self.arrivals.stream(rng)
        t = 0.0
        specs = []
        for i in range(self.num_requests):
            t += self.arrivals.gap(gaps)
            k = rng.choices(range(self.num_prefixes), weights)[0]
            n_suffix = self.suffix_len.sample(rng)
            check_prompt_len(f"req-{i:06d}", self.prefix_len + n_suffix, max_prompt_len)
            suffix = tokenizer.random_token_ids(n_suffix, rng)
            specs.append(
                RequestSpec(
                    request_id=f"req-{i:06d}",
                    arrival_time=t,
                    prompt_token_ids=prefixes[k] + suffix,
                    output_len=self.output_len.sample(rng),
                    priority=rng.randrange(self.num_priorities),
                )
            )
        return specs
