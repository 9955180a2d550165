"""``Engine.add_request``: a request (and its ``n > 1`` siblings) queued and recorded on arrival; an id
already queued, its own or a sibling's, refused with ValueError and nothing queued."""

from __future__ import annotations

import pytest

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.engine import Engine


@pytest.fixture
def engine() -> Engine:
    return build_engine(compose_config(["model=synthetic", "clock=simulated", "progress=false", "report=false"]))


def request(rid: str, n: int = 1, arrival: float = 0.0) -> Request:
    return Request(rid, [40, 41, 42], SamplingParams(max_tokens=3, n=n, ignore_eos=True), arrival_time=arrival)


def test_a_request_is_queued_and_recorded_at_its_arrival(engine: Engine) -> None:
    engine.add_request(request("a", arrival=1.5))
    assert engine.scheduler.num_unfinished == 1
    timeline = engine.recorder.requests["a"]
    assert (timeline.arrival_time, timeline.num_prompt_tokens) == (1.5, 3)


def test_siblings_are_queued_and_recorded_with_their_parent(engine: Engine) -> None:
    engine.add_request(request("p", n=3))
    assert engine.scheduler.num_unfinished == 3
    assert sorted(engine.recorder.requests) == ["p", "p#1", "p#2"]


@pytest.mark.parametrize(
    ("first", "second"),
    [(request("a"), request("a")), (request("a", n=2), request("a#1")), (request("a#1"), request("a", n=2))],
    ids=["same-id", "a-siblings-id", "id-of-a-sibling-to-be"],
)
def test_an_id_already_queued_is_refused(engine: Engine, first: Request, second: Request) -> None:
    engine.add_request(first)
    queued = engine.scheduler.num_unfinished
    with pytest.raises(ValueError, match="duplicate request id"):
        engine.add_request(second)
    assert engine.scheduler.num_unfinished == queued
    engine.run([])
    engine.check_idle()
