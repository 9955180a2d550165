"""The column-wise plain decodes (``SchedulerOutput.decodes``, ``ModelOutput.decode_token_ids``,
``StepOutputs``) give what the same rows as ``ScheduledRequest`` objects give."""

from __future__ import annotations

import dataclasses

import pytest

from forge.config import compose_config
from forge.core.outputs import DecodeRows, ModelOutput, RequestOutput, ScheduledRequest, SchedulerOutput
from forge.engine.build import build_engine, workload_requests
from forge.engine.sim_runner import SimulationRunner
from forge.policies.prefill_first import PrefillFirst
from forge.sched.step_outputs import StepOutputs
from tests.sched_helpers import request, scheduler, step

BASE = ["model=synthetic", "clock=simulated", "workload=sharegpt", "workload.num_requests=16", "progress=false"]
TIGHT = ["workload=fixed", "workload.input_len.value=40", "workload.output_len.value=60", "kvcache.block_size=16"]
TIGHT += ["kvcache.num_blocks=24"]


def test_scheduled_is_the_decodes_then_the_chunks() -> None:
    chunk = ScheduledRequest("c", 0, 3, [1, 2, 3], [4], False)
    sched = SchedulerOutput([chunk], 5, decodes=DecodeRows(["a", "b"], [7, 9], [11, 12], [[1, 2], [3]]))
    assert sched.scheduled == [
        ScheduledRequest("a", 7, 1, [11], [1, 2], True),
        ScheduledRequest("b", 9, 1, [12], [3], True),
        chunk,
    ]
    assert sched.num_rows == 3 and not sched.is_empty
    assert SchedulerOutput([], 0).is_empty and SchedulerOutput([chunk], 3).scheduled == [chunk]


def test_every_plain_decode_is_columnar() -> None:
    """One representation of decodes: every plain decode is a row of ``decodes`` (first, as vLLM
    lays out its batch), never of ``chunks``, whatever the policy schedules before it."""
    s = scheduler()
    for rid in ("a", "b"):
        s.add_request(request(rid, 6, max_tokens=8))
    step(s)  # both prompts
    so, _ = step(s)
    assert so.decodes.request_ids == ["a", "b"] and so.chunks == []
    assert so.decodes.starts == [6, 6] and [r.start for r in so.scheduled] == [6, 6]
    # A request still prefilling, ordered first by the policy: the decodes after it are still columns.
    s = scheduler(policy=PrefillFirst(), budget=12)
    for rid, prompt in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8]), ("c", list(range(20, 34)))):
        s.add_request(request(rid, prompt, max_tokens=8))
    step(s)
    so, _ = step(s)
    assert [r.request_id for r in so.scheduled] == ["a", "b", "c"]
    assert so.decodes.request_ids == ["a", "b"] and so.decodes.starts == [4, 4]
    assert [(r.request_id, r.num_tokens) for r in so.chunks] == [("c", 10)]


@pytest.mark.parametrize(
    "overrides",
    [
        ["scheduler=prefill_first"],
        ["scheduler=vllm_v0"],
        [*TIGHT, "engine.preemption_mode=swap", "kvcache.num_cpu_blocks=400"],
        TIGHT,
        [*TIGHT, "scheduler=vllm_v0", "engine.preemption_mode=swap", "kvcache.num_cpu_blocks=400"],
        ["workload=shared_prefix", "kvcache.enable_prefix_caching=true", "workload.prefix_len=64"],
    ],
)
def test_no_chunk_is_a_plain_decode(overrides: list[str]) -> None:
    """Through admission, swap-in, preemption (``TIGHT``: a pool too small for the batch) and prefix
    hits, a row that is a plain decode (one token of a decoding request, sampled, no drafts) is
    always in ``decodes``."""
    cfg = compose_config([*BASE, "workload.num_requests=24", *overrides])
    engine = build_engine(cfg)
    for r in workload_requests(cfg, engine):
        engine.add_request(r)
    decodes = steps = 0
    while engine.has_unfinished():
        so = engine.scheduler.schedule()
        for c, r in zip(so.chunks, so.chunk_requests, strict=True):
            assert not r.is_decoding, f"{c.request_id}: a plain decode among the chunks"
        decodes += len(so.decodes)
        steps += 1
        if not so.is_empty:
            engine.scheduler.update(so, engine.runner.execute(so), engine.tokenizer.eos_token_ids)
    assert decodes > 0 and steps > 10


def test_update_skips_a_decode_aborted_after_scheduling() -> None:
    s = scheduler()
    for rid in ("a", "b", "c"):
        s.add_request(request(rid, 5, max_tokens=3))
    step(s)
    so = s.schedule()
    assert so.decodes.request_ids == ["a", "b", "c"]
    s.abort("b")
    outs = s.update(so, ModelOutput({}, decode_token_ids=[40, 41, 42]), frozenset())
    assert isinstance(outs, StepOutputs) and len(outs) == 2
    assert [(o.request_id, o.new_token_ids, o.finished) for o in outs] == [("a", [40], False), ("c", [42], False)]
    so = s.schedule()
    outs = s.update(so, ModelOutput({}, decode_token_ids=[50, 52]), frozenset())
    assert [(o.request_id, o.token_ids, o.finish_reason) for o in outs.finished] == [
        ("a", [7, 40, 50], "length"),
        ("c", [7, 42, 52], "length"),
    ]
    assert outs.finished == [o for o in outs if o.finished]


def test_update_of_an_output_it_did_not_schedule_last() -> None:
    """``update`` given a SchedulerOutput other than the one ``schedule`` just returned (an equal
    copy) finds its requests by id, column-wise decode tokens included."""
    s = scheduler()
    for rid in ("a", "b"):
        s.add_request(request(rid, 5, max_tokens=4))
    step(s)
    so = s.schedule()
    outs = s.update(dataclasses.replace(so), ModelOutput({}, decode_token_ids=[40, 41]), frozenset())
    assert [(o.request_id, o.new_token_ids, o.token_ids) for o in outs] == [("a", [40], [7, 40]), ("b", [41], [7, 41])]


def test_step_outputs_views_agree() -> None:
    done = RequestOutput("x", [1], [2, 3], [3], True, "stop")
    outs = StepOutputs(others=[RequestOutput("y", [1], [2], [2], False), done])
    assert outs.finished == [done] and list(outs) == outs.outputs and outs[1] is done and len(outs) == 2


@pytest.mark.parametrize(
    "overrides", [[], ["sampling=random"], ["+sampling.n=2", "kvcache.enable_prefix_caching=true"]]
)
def test_engine_steps_match_the_tensor_path(overrides: list[str]) -> None:
    """Every step's outputs (not only the final ones) equal the tensor path's, which builds each row
    as a ``ScheduledRequest`` and each output eagerly."""
    steps = []
    for host in (True, False):
        cfg = compose_config([*BASE, *overrides])
        engine = build_engine(cfg)
        runner = engine.runner
        assert isinstance(runner, SimulationRunner)
        runner.host = host
        for r in workload_requests(cfg, engine):
            engine.add_request(r)
        outputs = []
        while engine.has_unfinished():
            outputs.append(
                [
                    (o.request_id, list(o.token_ids), o.new_token_ids, o.finished, o.finish_reason, o.num_cached_tokens)
                    for o in engine.step()
                ]
            )
        steps.append(outputs)
    assert steps[0] == steps[1] and len(steps[0]) > 20


def test_step_outputs_read_a_step_late_keep_their_step() -> None:
    """A step's outputs read after the next step still give that step's new token and finish state."""
    s = scheduler()
    for rid in ("a", "b"):
        s.add_request(request(rid, 5, max_tokens=3))
    step(s)
    so = s.schedule()
    first = s.update(so, ModelOutput({}, decode_token_ids=[40, 41]), frozenset())
    so = s.schedule()
    s.update(so, ModelOutput({}, decode_token_ids=[50, 51]), frozenset())  # both finish (max_tokens=3)
    assert [(o.request_id, o.new_token_ids, o.finished, o.finish_reason) for o in first] == [
        ("a", [40], False, None),
        ("b", [41], False, None),
    ]
    assert first.finished == []


def test_update_decodes_column_wise_as_chunks() -> None:
    """``update`` gives the same outputs and request states for a step's plain decodes handed over
    column-wise (``SchedulerOutput.decodes``) as for the same rows as ``ScheduledRequest`` chunks."""
    results = []
    for columns in (True, False):
        s = scheduler(max_model_len=11)
        s.add_request(request("a", 5, max_tokens=8))
        s.add_request(request("b", 6, max_tokens=2))
        s.add_request(request("c", 4, max_tokens=8))
        step(s)
        history = []
        for i in range(6):
            so = s.schedule()
            if so.is_empty:
                break
            if not columns:
                so = dataclasses.replace(so, chunks=so.scheduled, decodes=DecodeRows(), chunk_requests=so.requests)
            tokens = {r.request_id: [60 + i + j] for j, r in enumerate(so.scheduled) if r.sample}
            outs = s.update(so, ModelOutput(tokens), frozenset({62}))
            history.append(
                [(o.request_id, list(o.token_ids), o.new_token_ids, o.finished, o.finish_reason) for o in outs]
            )

        states = {r.request_id: (r.num_computed_tokens, r.status) for r in s.running}
        results.append((history, states, s.kv.num_free_blocks()))
    assert results[0] == results[1]
    assert any(o[3] for h in results[0][0] for o in h)  # some requests finished (stop token, length, max_model_len)
