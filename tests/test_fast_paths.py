"""Fast paths never change an answer (``forge.core.fast_paths``): every shipped option, and user
components written as the README shows (stateful hooks, overridden methods, a cost model, a clock, a
model, a drafter and a workload of their own), give the same requests, steps, summary, tokens and KV
state with ``engine.fast_paths`` on as off; declared components do take the fast paths, undeclared
ones call every hook the plain loop calls."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from forge.config import CONF_DIR, compose_config
from forge.core.fast_paths import declares_fast_paths, plain_components
from forge.engine.build import build_engine, workload_requests
from forge.engine.engine import Engine
from forge.results.metrics import summarize
from forge.sim.profiled import PROFILE_FEATURES

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]
SMALL = ["workload.num_requests=30", "workload.arrivals.rate=30"]
COMPONENTS = "tests.fast_path_components"
VLLM_V0 = ["engine.enable_chunked_prefill=false", "engine.max_num_batched_tokens=2048"]
PREFIX = ["workload=shared_prefix", "workload.num_requests=24"]


def shipped_options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def option_cases() -> dict[str, list[str]]:
    """One small simulated run per shipped option of each group a user swaps (the rest default)."""
    cases: dict[str, list[str]] = {}
    for name in shipped_options("scheduler"):
        extra = VLLM_V0 if name == "vllm_v0" else []
        cases[f"scheduler={name}"] = [f"scheduler={name}", *SMALL, "workload.num_priorities=3", *extra]
    for name in shipped_options("kvcache"):
        cases[f"kvcache={name}"] = [f"kvcache={name}", *SMALL]
    for name in shipped_options("drafter"):
        cases[f"drafter={name}"] = [f"drafter={name}", *SMALL]
    for name in shipped_options("sampling"):
        cases[f"sampling={name}"] = [f"sampling={name}", *SMALL]
    for name in shipped_options("workload"):
        if name in ("trace", "vidur_trace"):  # need a file: trace_case (vidur_trace: tests/test_vidur_trace.py)
            continue
        size = ["workload.num_requests=24"] if name in ("fixed", "shared_prefix") else SMALL
        if name == "vidur_poisson":  # its prompts: 2,048 tokens, outputs 512
            size = ["workload.num_requests=12", "workload.arrivals.rate=4", "engine.max_model_len=4096"]
        if name.startswith("azure_"):  # the shipped traces: their first 30 rows, replayed 20x faster
            size = ["workload.max_requests=30", "workload.time_scale=0.05"]
        if name == "vidur_synthetic":  # the same lengths; Vidur names the rate qps
            size = ["workload.num_requests=12", "workload.arrivals.qps=4", "engine.max_model_len=4096"]
        cases[f"workload={name}"] = [f"workload={name}", *size]
    for cost in ("roofline", "operators"):
        cases[f"clock.cost={cost}"] = ["clock.hardware=a100", f"clock.cost={cost}", *SMALL]
    cases["backend=cpu"] = ["backend=cpu", *SMALL]
    cases["model=tiny"] = ["model=tiny", "workload.num_requests=12", "workload.output_len.high=24"]  # no host path
    cases["preemption+swap"] = [*SMALL, "kvcache.num_blocks=40", "engine.preemption_mode=swap"]
    cases["prefix-caching"] = [*PREFIX, "kvcache.enable_prefix_caching=true"]
    # one-token prompts, one-token blocks, a pool that preempts: a request recomputing after a preemption
    # hits blocks that an earlier chunk of the same step computes and decodes at once, reading them (the
    # host path read them before that chunk wrote them: other tokens than forward's)
    cases["prefix-hit-on-a-chunk-of-the-step"] = [
        "workload=fixed",
        "workload.num_requests=20",
        "workload.input_len.value=1",
        "workload.output_len.value=32",
        "kvcache.block_size=1",
        "kvcache.num_blocks=50",
        "kvcache.enable_prefix_caching=true",
    ]
    return cases


def user_cases() -> dict[str, list[str]]:
    """User components, each plugged in by ``_target_`` as the README shows."""
    vllm = VLLM_V0
    return {
        "stateful-budget": [f"scheduler._target_={COMPONENTS}.AlternatingBudget", *SMALL],
        "rotating-order": [f"scheduler._target_={COMPONENTS}.RotatingOrder", *SMALL],
        "counting-sarathi": ["scheduler=sarathi", f"scheduler._target_={COMPONENTS}.CappedSarathi", *SMALL],
        "declared-policy": [f"scheduler._target_={COMPONENTS}.DeclaredSJF", *SMALL],
        "allocate-slots": [f"kvcache._target_={COMPONENTS}.CountingPaged", "kvcache.num_blocks=64", *SMALL],
        "allocate-slots-v0": [
            "scheduler=vllm_v0",
            *vllm,
            f"kvcache._target_={COMPONENTS}.CountingPaged",
            "kvcache.num_blocks=64",
            *SMALL,
        ],
        "cost-model": [f"+clock.cost_model._target_={COMPONENTS}.JitterCost", *SMALL],
        "clock": [f"clock._target_={COMPONENTS}.OverheadClock", *SMALL],
        "model": [f"model._target_={COMPONENTS}.ShiftedModel", *SMALL],
        "drafter": ["drafter=ngram", f"drafter._target_={COMPONENTS}.MoodyDrafter", *SMALL],
        "workload": [
            "workload=fixed",
            f"workload._target_={COMPONENTS}.StaircaseWorkload",
            "~workload.arrivals",
            "~workload.input_len",
            "~workload.output_len",
            "~workload.num_priorities",
            "~workload.ignore_eos",
        ],
    }


def run(overrides: list[str], fast: bool) -> tuple[Engine, dict[str, Any], list[tuple[str, list[int]]]]:
    """The engine after a run, the run's summary, and its finals (id, tokens) in the order returned."""
    cfg = compose_config([*BASE, *overrides, f"engine.fast_paths={str(fast).lower()}"])
    engine = build_engine(cfg)
    finals = engine.run(workload_requests(cfg, engine))
    summary = summarize(engine.recorder.requests_frame(), engine.recorder.steps_frame(), engine.scheduler.kv.stats())
    return engine, summary, [(rid, list(out.token_ids)) for rid, out in finals.items()]


def assert_same(overrides: list[str]) -> tuple[Engine, Engine]:
    """Fast paths on and off give the same run, bit for bit; returns (on, off)."""
    on, s_on, f_on = run(overrides, True)
    off, s_off, f_off = run(overrides, False)
    assert len(f_on) >= 10
    assert f_on == f_off
    assert on.recorder.requests_frame().equals(off.recorder.requests_frame())
    assert on.recorder.steps_frame().equals(off.recorder.steps_frame())
    assert s_on == s_off
    assert on.clock.now() == off.clock.now()
    assert on.scheduler.kv.stats() == off.scheduler.kv.stats()
    assert not off.decode_runs
    return on, off


@pytest.mark.parametrize("case", sorted(option_cases()))
def test_every_shipped_option_is_the_same_with_fast_paths_off(case: str) -> None:
    on, _ = assert_same(option_cases()[case])
    assert on.plain_components() == []  # every shipped component declares its fast paths


def test_a_trace_workload_is_the_same_with_fast_paths_off(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    rows = [
        {"arrival_time": 0.05 * i, "input_len": 10 + 13 * (i % 5), "output_len": 5 + 3 * (i % 7)} for i in range(30)
    ]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert_same(["workload=trace", f"workload.path={path}"])


def test_a_profiled_clock_is_the_same_with_fast_paths_off(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*PROFILE_FEATURES, "step_time_s"])
        for i in range(60):
            seqs, tokens = 1 + i % 9, 1 + (i * 37) % 700
            row = [seqs, tokens, i % 3, 100 * seqs + i, 40.0 * tokens, seqs]
            writer.writerow([*row, 1e-3 + 2e-5 * seqs + 1e-5 * tokens + 3e-8 * row[3] + 1e-9 * row[4]])
    assert_same(["clock=profiled", f"clock.profile={path}", *SMALL])


@pytest.mark.parametrize("case", sorted(user_cases()))
def test_user_components_get_the_plain_loops_answer(case: str) -> None:
    """Undeclared user components run the plain path with fast paths on: the same results, and every
    hook called as often as the plain loop calls it."""
    on, off = assert_same(user_cases()[case])
    for a, b in zip(components(on), components(off), strict=True):
        assert type(a) is type(b)
        calls_a, calls_b = getattr(a, "calls", None), getattr(b, "calls", None)
        if calls_a is not None:
            assert calls_b is not None and calls_a.counts == calls_b.counts and calls_a.counts
    assert_hooks_called_each_step(on)
    if case in ("declared-policy", "workload", "drafter"):  # nothing undeclared (decode runs wait for no drafter)
        assert on.decode_runs and on.plain_components() == []
    else:
        assert not on.decode_runs and on.plain_components()


def assert_hooks_called_each_step(engine: Engine) -> None:
    """What the plain loop calls: a policy's budget and order and a clock's ``step_finished`` once a
    step, a cost model's ``step_time`` once a step, ``allocate_slots`` once per decoded token at least."""
    steps = len(engine.recorder.steps)
    decoded = sum(max(len(tl.token_times) - 1, 0) for tl in engine.recorder.requests.values())
    least = {"token_budget": steps, "running_order": steps, "propose": 1, "allocate_slots": decoded}
    exact = {"step_time": steps, "step_finished": steps}
    for component in components(engine):
        for hook, n in getattr(getattr(component, "calls", None), "counts", {}).items():
            assert n == exact[hook] if hook in exact else n >= least[hook], (hook, n, steps, decoded)


def components(engine: Engine) -> list[object]:
    clock = engine.clock
    cost = getattr(clock, "cost_model", None)
    return [engine.scheduler.policy, engine.scheduler.kv, clock, cost, engine.runner.model, engine.drafter]


def test_declared_components_take_the_fast_paths() -> None:
    """The default simulated run takes decode runs and the host path; off, it takes neither."""
    overrides = ["workload.num_requests=20", "workload.arrivals.rate=5"]
    on = build_engine(compose_config([*BASE, *overrides]))
    off = build_engine(compose_config([*BASE, *overrides, "engine.fast_paths=false"]))
    assert on.decode_runs and getattr(on.runner, "host", False)
    assert not off.decode_runs and not getattr(off.runner, "host", True)


def test_a_subclass_inherits_no_declaration() -> None:
    from tests.fast_path_components import CappedSarathi, DeclaredSJF, RotatingOrder

    assert declares_fast_paths(DeclaredSJF())
    assert not declares_fast_paths(RotatingOrder()) and not declares_fast_paths(CappedSarathi())
    assert plain_components({"scheduler": RotatingOrder(), "drafter": None}) == ["scheduler: RotatingOrder"]


def test_fast_paths_setting_must_be_a_bool() -> None:
    proc = subprocess.run(
        [sys.executable, "run.py", *BASE, "engine.fast_paths=maybe"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "engine.fast_paths" in lines[0] and "Traceback" not in proc.stderr
