"""Event runs: a fresh engine's whole run computed event by event (``forge.sim.event_replica``) instead of
step by step, with the same records — the timing-only fast path of a cluster (``ReplicaPool.run`` with
``keep=False``, as ``python run.py`` runs it).

Taken only where every component declares it: ``event_runs = True`` in the own class body of the policy,
the KV cache, the clock and the model (nothing inherited, as ``forge.core.fast_paths``; shipped: ``FCFS``,
``PagedKVCache`` without prefix caching or windowed groups, ``SimulatedClock`` with a ``SummedCostModel``,
``SyntheticModel`` with ``timing_only=True``), fast paths on, no drafter, and every request plain greedy to
its length limit (one sequence, no constraint, no prompt logprobs). A declaring class promises that the
engine's steps with it are those of the model: FCFS admission, one block per ``block_size`` positions
allocated when first written, the clock's time from ``StepSums``, no token read. Where a run leaves the
model (a preemption) nothing is changed and the engine runs it. The engine is left as its own run leaves it
(idle, its recorder holding every request and step, its clock at the last step's end), except the order of
its KV pool's free blocks, which only a later run on the same engine could see."""

from __future__ import annotations

from collections.abc import Sequence

from forge.core.request import Request
from forge.engine.engine import Engine
from forge.results.step_log import StepLog
from forge.sim.event_replica import EventReplica, LeftTheModel, ReplicaLimits
from forge.sim.step_sums import SummedCostModel

EVENT_RUNS = "event_runs"  # the class attribute a component's own class sets to True to declare


def declares_event_runs(component: object) -> bool:
    """Whether ``component``'s own class (not a base class) declares ``event_runs = True``."""
    return vars(type(component)).get(EVENT_RUNS) is True


def event_replica(engine: Engine, steps: StepLog) -> EventReplica | None:
    """The model of ``engine``'s run from now, recording its steps into ``steps``; None when the engine
    cannot take event runs."""
    s, clock, model = engine.scheduler, engine.clock, engine.runner.model
    if not (engine.decode_runs and engine.drafter is None and s.takes_decode_runs):
        return None
    if not all(map(declares_event_runs, (s.policy, s.kv, clock, model))) or engine.has_unfinished():
        return None
    cost = getattr(clock, "cost_model", None)
    if not isinstance(cost, SummedCostModel) or not getattr(model, "timing_only", False):
        return None
    kv = s.kv
    if getattr(kv, "enable_prefix_caching", True) or getattr(kv, "kv_groups", True) is not None:
        return None
    if engine.recorder.requests or len(engine.recorder.steps) or kv.num_free_blocks() != kv.num_blocks:
        return None  # (its step numbers start at 0; every block is free)
    lim, policy = s.limits, s.policy
    limits = ReplicaLimits(
        budget=policy.token_budget(lim.max_num_batched_tokens),
        max_num_seqs=lim.max_num_seqs,
        num_blocks=kv.num_blocks,
        block_size=kv.block_size,
        max_model_len=lim.max_model_len,
        chunked_prefill=lim.enable_chunked_prefill,
        watermark_blocks=policy.admission_watermark * kv.num_blocks,
    )
    return EventReplica(limits, cost, clock.now(), steps.append)


def plain_to_length(request: Request) -> bool:
    """Whether ``request`` is fresh and plain greedy to its length limit, one sequence, nothing else asked."""
    sp = request.sampling_params
    return (
        sp.greedy_to_length
        and sp.n == 1
        and sp.prompt_logprobs is None
        and request.constraint is None
        and request.pooling_params is None
        and request.beam_search is None
        and request.num_computed_tokens == 0
        and not request.output_token_ids
        and request.num_prompt_tokens > 0
    )


def run_by_events(engines: Sequence[Engine], offsets: Sequence[float], requests: Sequence[list[Request]]) -> bool:
    """Run ``requests[i]`` (in arrival order, times from the run's start) on ``engines[i]`` (whose clock read
    ``offsets[i]`` at the start) by events, recording into each engine; True if done. False, no engine and
    no request changed, when some engine cannot take event runs, some request is not plain, or some run
    leaves the model."""
    logs = [StepLog() for _ in engines]
    replicas = [event_replica(e, log) for e, log in zip(engines, logs, strict=True)]
    if any(r is None for r in replicas) or not all(plain_to_length(r) for own in requests for r in own):
        return False
    if any(e.scheduler.refuses_any(own) for e, own in zip(engines, requests, strict=True)):
        return False  # (the engine refuses it at add_request)
    ids = [r.request_id for own in requests for r in own]
    if len(set(ids)) != len(ids):
        return False  # (the engine refuses a duplicate id)
    ordered = [sorted(own, key=lambda r: (r.arrival_time, r.request_id)) for own in requests]  # FCFS's order
    try:
        for replica, own, offset in zip(replicas, ordered, offsets, strict=True):
            assert replica is not None
            replica.run(own, offset)
    except LeftTheModel:
        return False
    for engine, replica, log, own, fcfs, offset in zip(
        engines, replicas, logs, requests, ordered, offsets, strict=True
    ):
        assert replica is not None
        _record(engine, replica, log, own, fcfs, offset)
    return True


def _record(
    engine: Engine, replica: EventReplica, steps: StepLog, requests: list[Request], fcfs: list[Request], offset: float
) -> None:
    """What the engine's run records: each request's arrival (in the order given, as ``add_request``) and
    timeline (``fcfs``: the order the replica ran them in), each step; its clock after it."""
    recorder = engine.recorder
    for r in requests:
        r.arrival_time += offset
        recorder.on_arrival(r, r.arrival_time)
    ends = replica.ends
    for f in replica.finished:
        times = ends[f.first_step : f.last_step + 1]
        recorder.on_event_run_end(fcfs[f.index].request_id, f.scheduled, times, "length")
    recorder.on_event_run_steps(steps)
    engine.clock.wait_until(replica.now)
