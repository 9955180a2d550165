"""Each shipped router decides as its docstring says, seen through ``ReplicaView``s of made-up replicas."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.routers.base import Router, reads_replicas
from forge.routers.least_kv import LeastKV
from forge.routers.least_outstanding import LeastOutstanding
from forge.routers.power_of_two import PowerOfTwo
from forge.routers.prefix_aware import PrefixAware
from forge.routers.random_router import RandomRouter
from forge.routers.round_robin import RoundRobin
from forge.routers.vidur_lor import VidurLOR


@dataclass
class View:
    """A replica as a router sees it (``forge.routers.base.ReplicaView``)."""

    index: int
    num_waiting: int = 0
    num_running: int = 0
    outstanding_tokens: int = 0
    kv_usage: float = 0.0
    cached: dict[str, int] = field(default_factory=dict)

    @property
    def num_outstanding(self) -> int:
        return self.num_waiting + self.num_running

    def prefix_match(self, request: Request) -> int:
        return self.cached.get(request.request_id, 0)


def request(rid: str = "r", n: int = 100) -> Request:
    return Request(rid, [1] * n, SamplingParams(max_tokens=4))


def test_round_robin_cycles() -> None:
    router, views = RoundRobin(), [View(i) for i in range(3)]
    assert [router.route(request(), views) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_random_is_seeded_and_uniform() -> None:
    views = [View(i) for i in range(4)]

    def picks(seed: int) -> list[int]:
        router = RandomRouter(seed=seed)
        return [router.route(request(), views) for _ in range(400)]

    assert picks(3) == picks(3) != picks(4)
    assert all(60 < picks(3).count(i) < 140 for i in range(4))


def test_least_outstanding_counts_running_but_vidur_lor_does_not() -> None:
    views = [View(0, num_waiting=1, num_running=9), View(1, num_waiting=3, num_running=0)]
    assert LeastOutstanding().route(request(), views) == 1  # 3 unfinished < 10
    assert VidurLOR().route(request(), views) == 0  # 1 queued < 3 queued: the running batch is not counted


def test_ties_go_to_the_lowest_index() -> None:
    views = [View(i) for i in range(3)]
    for router in (LeastOutstanding(), VidurLOR(), LeastKV()):
        assert router.route(request(), views) == 0


def test_least_kv_takes_the_emptiest_cache() -> None:
    views = [View(0, kv_usage=0.5), View(1, kv_usage=0.2), View(2, kv_usage=0.3)]
    assert LeastKV().route(request(), views) == 1


def test_power_of_two_takes_the_fewer_tokens_of_two_draws() -> None:
    views = [View(i, outstanding_tokens=100 * (i + 1)) for i in range(4)]
    router, twin = PowerOfTwo(seed=5), PowerOfTwo(seed=5)
    for _ in range(50):
        picked = router.route(request(), views)
        assert picked != 3  # the busiest replica loses every pair it is drawn in
        assert twin.route(request(), views) == picked
    assert PowerOfTwo().route(request(), [View(0)]) == 0


def test_prefix_aware_takes_the_longest_hit_while_balanced() -> None:
    views = [View(0, kv_usage=0.1), View(1, cached={"r": 64}, kv_usage=0.9), View(2, cached={"r": 80}, kv_usage=0.9)]
    assert PrefixAware().route(request(n=100), views) == 2


def test_prefix_aware_below_the_cache_threshold_takes_the_most_free_kv() -> None:
    views = [View(0, cached={"r": 16}, kv_usage=0.5), View(1, kv_usage=0.1)]
    assert PrefixAware(cache_threshold=0.5).route(request(n=100), views) == 1
    assert PrefixAware(cache_threshold=0.1).route(request(n=100), views) == 0


def test_prefix_aware_falls_back_to_load_when_imbalanced() -> None:
    views = [View(0, num_waiting=40, cached={"r": 96}), View(1, num_waiting=2)]
    assert PrefixAware().route(request(n=100), views) == 1  # 40 - 2 > 32 and 40 > 1.0001 * 2
    assert PrefixAware(balance_abs_threshold=64).route(request(n=100), views) == 0


def test_prefix_aware_refuses_bad_thresholds() -> None:
    with pytest.raises(ValueError, match="router.cache_threshold"):
        PrefixAware(cache_threshold=1.5)
    with pytest.raises(ValueError, match="router.balance_abs_threshold"):
        PrefixAware(balance_abs_threshold=-1)
    with pytest.raises(ValueError, match="router.balance_rel_threshold"):
        PrefixAware(balance_rel_threshold=0.5)


def test_only_a_class_that_says_so_is_routed_up_front() -> None:
    class Counting(RoundRobin):  # a subclass inherits no promise: it may read the views
        pass

    assert not reads_replicas(RoundRobin()) and not reads_replicas(RandomRouter())
    assert reads_replicas(Counting()) and reads_replicas(LeastKV())
    assert issubclass(Counting, Router)
