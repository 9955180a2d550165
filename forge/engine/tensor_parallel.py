"""Tensor parallelism across processes: rank 0 runs the engine (scheduler, sampling) on its shard of
the model; ranks 1..N-1 only run their shards. Each step rank 0 broadcasts the plain-data
``SchedulerOutput`` (its ``scheduled`` rows and block operations, without the Request objects), every
rank builds the same ``ForwardBatch`` from it and runs its shard, and the shards' collectives
(``forge.parallel``) give every rank the full logits; rank 0 samples.

Ranks 1..N-1 are started by forge (``torch.multiprocessing``, spawn) or, when the process was
started by ``torchrun`` (``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT`` set), they are the
other torchrun processes (``worker_main``); a script that would re-run in each spawned rank (no
``if __name__ == "__main__":`` guard) is refused before any starts
(``forge.engine.spawn_guard``). A rank that exits makes rank 0's next step fail with a
``TensorParallelError`` naming it; a rank that hangs, after ``engine.distributed_timeout_s``."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from forge.config import ConfigError
from forge.core.kv_groups import KVCacheGroups
from forge.core.outputs import ModelOutput, SchedulerOutput
from forge.engine.engine import EngineDeadError
from forge.engine.runner import ModelRunner
from forge.engine.spawn_guard import check_spawn_guard
from forge.kernels.base import KernelBackend
from forge.models.base import Model
from forge.models.decoder import DecoderModel
from forge.parallel.group import DistributedGroup
from forge.parallel.shard import ShardError, check_shardable, shard_decoder

log = logging.getLogger("forge.engine.engine")


class TensorParallelError(EngineDeadError):
    """A tensor-parallel rank died or a collective failed; the engine cannot go on."""


@dataclass(frozen=True)
class WorkerSetup:
    """What rank 0 decided that the other ranks need before the first step."""

    num_blocks: int
    block_size: int
    num_cpu_blocks: int
    max_num_seqs: int
    max_model_len: int
    kv_dtype: torch.dtype
    seed: int
    kv_groups: KVCacheGroups | None = None

    def runner_args(self, shard: Model) -> dict[str, Any]:
        """``ModelRunner``'s arguments after the model and backend, for ``shard`` (its own KV heads)."""
        return {
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "seed": self.seed,
            "num_cpu_blocks": self.num_cpu_blocks,
            "max_num_seqs": self.max_num_seqs,
            "max_model_len": self.max_model_len,
            "kv_spec": dataclasses.replace(shard.kv_spec, dtype=self.kv_dtype),
            "kv_groups": self.kv_groups,
        }


def torchrun_env() -> tuple[int, int, str, int] | None:
    """``(rank, world size, master address, master port)`` when torchrun started this process."""
    env = os.environ
    if not all(k in env for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        return None
    return int(env["RANK"]), int(env["WORLD_SIZE"]), env["MASTER_ADDR"], int(env["MASTER_PORT"])


def rank_threads(cfg: DictConfig, world: int) -> None:
    """Give each rank its share of the cores unless ``backend.num_threads`` says otherwise."""
    if cfg.backend.get("num_threads") is None:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))


def rank_backend_config(cfg: DictConfig, rank: int) -> DictConfig:
    """``cfg.backend`` for ``rank``: on CUDA, rank r computes on ``cuda:r``."""
    node = OmegaConf.to_container(cfg.backend, resolve=True)
    assert isinstance(node, dict)
    if str(node.get("device", "")).startswith("cuda"):
        node["device"] = f"cuda:{rank}"
    return OmegaConf.create(node)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def for_workers(sched: SchedulerOutput) -> SchedulerOutput:
    """What the other ranks need of a step: its rows and block operations, no Request objects."""
    return SchedulerOutput(
        chunks=list(sched.scheduled),
        num_batched_tokens=sched.num_batched_tokens,
        swap_out=sched.swap_out,
        copy_blocks=sched.copy_blocks,
        swap_in=sched.swap_in,
    )


class TensorParallelRunner(ModelRunner):
    """Rank 0's runner over its shard of ``model`` (see the module doc). ``close`` stops the other ranks."""

    def __init__(self, model: Model, backend: KernelBackend, cfg: DictConfig, setup: WorkerSetup) -> None:
        if not isinstance(model, DecoderModel):
            raise TensorParallelError(f"{type(model).__name__} is not a decoder model: nothing to split")
        world = int(cfg.engine.tensor_parallel_size)
        timeout = float(cfg.engine.distributed_timeout_s)
        try:
            check_shardable(model, world)
        except ShardError as exc:
            raise ConfigError(f"engine.tensor_parallel_size={world}: {exc}") from exc
        env = torchrun_env()
        if env is not None and env[1] != world:
            raise ConfigError(f"engine.tensor_parallel_size={world} but torchrun started {env[1]} processes")
        self.workers: list[Any] = []
        if env is None:
            check_spawn_guard(f"engine.tensor_parallel_size={world}")
            address, port = "127.0.0.1", _free_port()
            ctx = torch.multiprocessing.get_context("spawn")
            container = OmegaConf.to_container(cfg, resolve=True)
            for rank in range(1, world):
                proc = ctx.Process(
                    target=worker_main, args=(container, rank, world, address, port), daemon=True, name=f"tp-rank{rank}"
                )
                proc.start()
                self.workers.append(proc)
        else:
            address, port = env[2], env[3]
        rank_threads(cfg, world)
        dist_backend = "nccl" if backend.device.type == "cuda" else "gloo"
        try:
            self.group = DistributedGroup(0, world, address, port, dist_backend, timeout)
            self.group.broadcast(setup)
        except Exception as exc:
            self.stop_workers()
            raise TensorParallelError(f"tensor-parallel start failed ({self.worker_status()}): {exc}") from exc
        shard = shard_decoder(model, self.group)
        super().__init__(shard, backend, **setup.runner_args(shard))

    def worker_status(self) -> str:
        dead = [f"{p.name} exited with code {p.exitcode}" for p in self.workers if p.exitcode is not None]
        return "; ".join(dead) or "every rank alive"

    def execute(self, sched: SchedulerOutput) -> ModelOutput:
        dead = [p for p in self.workers if p.exitcode is not None]
        if dead:
            raise TensorParallelError(f"tensor-parallel {self.worker_status()}")
        try:
            self.group.broadcast(for_workers(sched))
            return super().execute(sched)
        except RuntimeError as exc:  # torch.distributed reports a lost peer or a timeout as RuntimeError
            if isinstance(exc, TensorParallelError):
                raise
            raise TensorParallelError(f"tensor-parallel step failed ({self.worker_status()}): {exc}") from exc

    def stop_workers(self) -> None:
        for p in self.workers:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=10)
        self.workers = []

    def close(self) -> None:
        """Tell the other ranks to stop (if they can still hear) and wait for them."""
        if getattr(self, "group", None) is None:
            return
        if not any(p.exitcode is not None for p in self.workers):
            try:
                self.group.broadcast(None)
            except RuntimeError:
                log.warning("tensor-parallel ranks did not take the stop message")
        self.stop_workers()
        self.group.close()
        self.group = None  # type: ignore[assignment]


def worker_main(container: dict[str, Any], rank: int, world: int, address: str, port: int) -> None:
    """Rank ``rank`` (> 0): load the model, take rank 0's setup, then run a forward per broadcast
    step until the stop message (``None``)."""
    from forge.engine.make import make

    cfg = OmegaConf.create(container)
    assert isinstance(cfg, DictConfig)
    rank_threads(cfg, world)
    backend: KernelBackend = make("backend", rank_backend_config(cfg, rank))
    model = make("model", cfg.model, device=str(backend.device))
    dist_backend = "nccl" if backend.device.type == "cuda" else "gloo"
    group = DistributedGroup(rank, world, address, port, dist_backend, float(cfg.engine.distributed_timeout_s))
    setup: WorkerSetup = group.broadcast()
    shard = shard_decoder(model, group)
    runner = ModelRunner(shard, backend, **setup.runner_args(shard))
    while (sched := group.broadcast()) is not None:
        runner.forward_logits(sched)
    group.close()
