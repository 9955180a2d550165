"""Tensor parallelism (``engine.tensor_parallel_size``): a model's shards compute the same logits as the
whole model, and the multi-process engine gives the same greedy tokens as one process."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch

from forge.config import ConfigError
from forge.core.outputs import ScheduledRequest, SchedulerOutput
from forge.core.sampling_params import SamplingParams
from forge.engine.runner import ModelRunner
from forge.engine.tensor_parallel import TensorParallelError
from forge.kernels.torch_backend import TorchBackend
from forge.llm import LLM
from forge.models.llama import build_tiny
from forge.parallel.shard import ShardError, even_ranges, head_slices, shard_decoder

BLOCK = 16
REPO = Path(__file__).resolve().parent.parent


class Rendezvous:
    """Where in-process ranks (threads) swap tensors: every rank sees every rank's tensor, in rank order."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=60)
        self.slots: list[torch.Tensor | None] = [None] * world

    def exchange(self, rank: int, x: torch.Tensor) -> list[torch.Tensor]:
        self.slots[rank] = x.clone()
        self.barrier.wait()
        parts = [p for p in self.slots if p is not None]
        self.barrier.wait()
        return parts


class ThreadGroup:
    """``TensorParallelGroup`` over threads of this process (the collectives' arithmetic, no processes)."""

    def __init__(self, rank: int, rendezvous: Rendezvous) -> None:
        self.rank = rank
        self.world_size = rendezvous.world
        self.rendezvous = rendezvous

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack(self.rendezvous.exchange(self.rank, x)).sum(dim=0)

    def gather_columns(self, x: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
        parts = self.rendezvous.exchange(self.rank, x)
        assert [p.shape[-1] for p in parts] == list(widths)
        return torch.cat(parts, dim=-1)


def steps() -> list[SchedulerOutput]:
    """A 20-token prefill of two requests, then a decode step of both."""
    a, b = list(range(3, 23)), list(range(40, 60))
    prefill = [ScheduledRequest("a", 0, 20, a, [0, 1], True), ScheduledRequest("b", 0, 20, b, [2, 3], True)]
    decode = [ScheduledRequest("a", 20, 1, [7], [0, 1], True), ScheduledRequest("b", 20, 1, [9], [2, 3], True)]
    return [SchedulerOutput(prefill, 40), SchedulerOutput(decode, 2)]


def run_ranks(world: int, job: Callable[[int, ThreadGroup], list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    rendezvous = Rendezvous(world)
    results: list[list[torch.Tensor]] = [[] for _ in range(world)]
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = job(rank, ThreadGroup(rank, rendezvous))
        except BaseException as exc:
            errors.append(exc)
            rendezvous.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    return results


@pytest.mark.parametrize(
    ("heads", "kv_heads", "world"),
    [(4, 2, 2), (6, 3, 2), (4, 1, 2), (4, 2, 4)],
    ids=["even", "uneven-like-smollm2", "kv-replicated", "kv-replicated-4"],
)
def test_shards_compute_the_whole_models_logits(heads: int, kv_heads: int, world: int) -> None:
    model = build_tiny(hidden_size=8 * heads, num_heads=heads, num_kv_heads=kv_heads, intermediate_size=90)
    backend = TorchBackend("cpu")
    whole = ModelRunner(model, backend, num_blocks=4, block_size=BLOCK)
    expected = [whole.forward_logits(s) for s in steps()]

    def job(rank: int, group: ThreadGroup) -> list[torch.Tensor]:
        runner = ModelRunner(shard_decoder(model, group), backend, num_blocks=4, block_size=BLOCK)
        return [runner.forward_logits(s) for s in steps()]

    for rank_logits in run_ranks(world, job):
        for got, want in zip(rank_logits, expected, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_head_and_range_splits() -> None:
    assert even_ranges(9, 2) == [(0, 5), (5, 9)]
    smollm2 = head_slices(9, 3, 2)  # SmolLM2-135M: 9 query heads over 3 KV heads
    assert [(h.q_start, h.q_end, h.kv_start, h.kv_end) for h in smollm2] == [(0, 6, 0, 2), (6, 9, 2, 3)]
    with pytest.raises(ShardError, match="cannot be split over 4 ranks"):
        head_slices(9, 3, 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=synthetic"], "needs a real model"),
        (["model.num_heads=9", "model.num_kv_heads=3", "model.hidden_size=72"], "cannot be split over 4 ranks"),
    ],
)
def test_a_model_that_cannot_be_split_is_a_config_error(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LLM(*overrides, "engine.tensor_parallel_size=4")
    assert not ranks()


def ranks() -> list[multiprocessing.process.BaseProcess]:
    """The tensor-parallel rank processes this process started that are still alive."""
    return [c for c in multiprocessing.active_children() if c.name.startswith("tp-rank")]


@pytest.fixture
def no_stray_ranks() -> Iterator[None]:
    yield
    for rank in ranks():
        rank.join(timeout=10)
    assert not ranks()


PROMPTS = ["Hello there", "The quick brown fox", "a" * 40]


def test_two_processes_give_the_same_greedy_tokens_and_a_dead_rank_fails_the_engine(no_stray_ranks: None) -> None:
    params = SamplingParams(max_tokens=12, temperature=0.0)
    with LLM("model=tiny") as one:
        expected = [o.token_ids for o in one.generate(PROMPTS, params)]
    with LLM("model=tiny", "engine.tensor_parallel_size=2", "engine.distributed_timeout_s=30") as two:
        assert [o.token_ids for o in two.generate(PROMPTS, params)] == expected
        (rank1,) = [c for c in multiprocessing.active_children() if c.name == "tp-rank1"]
        assert rank1.pid is not None
        os.kill(rank1.pid, signal.SIGKILL)
        rank1.join(timeout=10)
        with pytest.raises(TensorParallelError, match="tp-rank1 exited"):
            two.generate(PROMPTS[:1], params)


@pytest.mark.slow
def test_served_mode_with_two_ranks_answers_as_one_process(no_stray_ranks: None) -> None:
    import httpx

    from tests.server_helpers import serving

    body = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 12, "temperature": 0}

    def completion(*overrides: str) -> str:
        with serving(["model=tiny", *overrides], "tiny") as server:
            r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["text"])

    assert completion("engine.tensor_parallel_size=2") == completion()


@pytest.mark.slow
def test_run_py_and_torchrun_with_two_ranks_give_each_request_the_same_output_length(tmp_path: Path) -> None:
    def lengths(out: Path, *extra: str, launcher: tuple[str, ...] = ()) -> list[int]:
        cmd = [sys.executable, *launcher, "run.py", "model=tiny", "workload.num_requests=6", "report=false"]
        cmd += ["progress=false", *extra, f"hydra.run.dir={out}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        frame = pd.read_parquet(out / "requests.parquet").sort_values("request_id")
        return list(frame["num_output_tokens"])

    one = lengths(tmp_path / "one")
    assert lengths(tmp_path / "two", "engine.tensor_parallel_size=2") == one
    torchrun = ("-m", "torch.distributed.run", "--nproc-per-node=2")
    assert lengths(tmp_path / "torchrun", "engine.tensor_parallel_size=2", launcher=torchrun) == one


@pytest.mark.slow
@pytest.mark.realmodel
def test_smollm2_split_over_two_ranks_gives_the_same_greedy_tokens(no_stray_ranks: None) -> None:
    params = SamplingParams(max_tokens=16, temperature=0.0)
    with LLM("model=smollm2") as one:
        expected = [o.token_ids for o in one.generate(PROMPTS, params)]
    with LLM("model=smollm2", "engine.tensor_parallel_size=2") as two:
        assert [o.token_ids for o in two.generate(PROMPTS, params)] == expected
