"""Vidur's Poisson arrivals (workload=vidur_poisson): the same arrival times, draw for draw, as
Vidur's SyntheticRequestGenerator, computed here the way Vidur's code computes them."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hydra.utils import instantiate

from forge.config import compose_config
from forge.tokenizers.base import ByteTokenizer
from forge.workloads.synthetic import Poisson
from forge.workloads.vidur_arrivals import VidurPoisson


def vidur_arrival_times(qps: float, num_requests: int, seed: int = 42) -> list[float]:
    """vidur/request_generator: set_seeds(seed) (random.seed), then per request
    PoissonRequestIntervalGenerator.get_next_inter_request_time() added to the last arrival."""
    saved = random.getstate()
    try:
        random.seed(seed)
        times, t = [], 0.0
        for _ in range(num_requests):
            interval = -math.log(1.0 - random.random()) / qps
            t += min(interval, (1.0 / qps) * 3.0)  # max_interval = std * 3.0, std = 1.0 / qps
            times.append(t)
        return times
    finally:
        random.setstate(saved)


def arrival_times(arrivals: VidurPoisson, n: int) -> list[float]:
    rng = arrivals.stream(random.Random(0))
    t, out = 0.0, []
    for _ in range(n):
        t += arrivals.gap(rng)
        out.append(t)
    return out


def test_the_workload_replays_vidurs_arrival_times() -> None:
    cfg = compose_config(["workload=vidur_poisson", "workload.num_requests=50", "workload.arrivals.rate=6"])
    specs = instantiate(cfg.workload).requests(ByteTokenizer())
    assert [s.arrival_time for s in specs] == vidur_arrival_times(6.0, 50)
    assert {len(s.prompt_token_ids) for s in specs} == {2048} and {s.output_len for s in specs} == {512}


def test_vidurs_ten_thousand_requests_at_10_per_s_arrive_within_949_s() -> None:
    """Gaps are capped at 3 / qps, so they average (1 - e^-3) / qps: 5% more load than qps."""
    times = arrival_times(VidurPoisson(10.0), 10_000)
    assert times == vidur_arrival_times(10.0, 10_000)
    assert max(b - a for a, b in itertools.pairwise([0.0, *times])) == pytest.approx(0.3)
    assert times[-1] == pytest.approx(10_000 * (1 - math.exp(-3)) / 10, rel=0.01)
    assert 947 < times[-1] < 949  # Vidur's run of this trace lasts 949.8 s: its last arrival + one request


class AlmostOne(random.Random):
    def random(self) -> float:
        return 1.0 - 2.0**-53  # a gap of -log(2^-53) / qps: far past the cap


@pytest.mark.parametrize("qps", [10.0, 7.0, 6.0, 0.3])
def test_a_capped_gap_is_vidurs_max_interval_bit_for_bit(qps: float) -> None:
    """Vidur: std = 1.0 / qps, max_interval = std * 3.0 (at qps 10: 0.30000000000000004, not 3 / 10)."""
    assert VidurPoisson(qps).gap(AlmostOne()) == (1.0 / qps) * 3.0


def test_seeds_and_rates() -> None:
    assert arrival_times(VidurPoisson(3.0, seed=7), 20) == vidur_arrival_times(3.0, 20, seed=7)
    assert arrival_times(VidurPoisson(3.0), 20) != arrival_times(VidurPoisson(3.0, seed=7), 20)
    # the workload's own seed leaves Vidur's stream alone; forge's Poisson keeps using the workload's
    rng = random.Random("0/0")
    assert VidurPoisson(3.0).stream(rng) is not rng and Poisson(3.0).stream(rng) is rng
    base = ["workload=vidur_poisson", "workload.num_requests=5"]
    one, two = (instantiate(compose_config([*base, f"seed={s}"]).workload) for s in (0, 1))
    tok = ByteTokenizer()
    assert [r.arrival_time for r in one.requests(tok)] == [r.arrival_time for r in two.requests(tok)]
    with pytest.raises(ValueError, match=r"workload\.arrivals\.rate"):
        VidurPoisson(0.0)
