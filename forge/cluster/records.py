"""What a built cluster gives ``forge.main``: its replicas, and a run's merged records."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge.cluster.loop import Replica
from forge.cluster.results import merged_spec_stats, summed_counters
from forge.core.request import Request
from forge.engine.engine import Engine


def _nothing(duration: float) -> dict[str, Any]:
    return {}


@dataclass
class Records:
    """A run's merged ``requests`` and ``steps`` frames, and ``extra(duration)``: what the summary adds
    (per-replica load balance, pools, transfers) given the run's duration."""

    requests: Any
    steps: Any
    extra: Callable[[float], dict[str, Any]] = _nothing


@dataclass
class ClusterRun:
    """The built cluster: its ``replicas`` (every pool's) and ``run(requests, progress)``."""

    replicas: list[Replica]
    run: Callable[[list[Request], bool], Records]

    @property
    def first(self) -> Engine:
        """The engine the workload is built for (its tokenizer and limits)."""
        return self.replicas[0].engine

    def close(self) -> None:
        for replica in self.replicas:
            replica.engine.close()

    def counters(self) -> dict[str, int]:
        return summed_counters(self.replicas)

    def spec_summary(self) -> dict[str, Any]:
        stats = merged_spec_stats(self.replicas)
        return stats.summary() if stats is not None else {}
