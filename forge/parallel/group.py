"""The collectives of ``forge.models.decoder.TensorParallelGroup`` on ``torch.distributed``, plus the
object broadcast the engine's ranks use to share each step. Every collective is bounded by the
group's timeout, so a rank that died makes the others fail instead of waiting for ever."""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist


class DistributedGroup:
    """This process's place in a ``torch.distributed`` group of ``world_size`` ranks: ``backend`` gloo
    (CPU tensors) or nccl (CUDA), rendezvous at ``address:port`` (rank 0 listens there)."""

    def __init__(
        self, rank: int, world_size: int, address: str, port: int, backend: str = "gloo", timeout_s: float = 120.0
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout_s = timeout_s
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x)
        return x

    def gather_columns(self, x: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
        widest = max(widths)
        padded = torch.nn.functional.pad(x, (0, widest - x.shape[-1])).contiguous()
        parts = [torch.empty_like(padded) for _ in widths]
        dist.all_gather(parts, padded)
        return torch.cat([p[..., :w] for p, w in zip(parts, widths, strict=True)], dim=-1)

    def broadcast(self, obj: Any = None) -> Any:
        """Rank 0's ``obj`` on every rank (the others pass nothing)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
