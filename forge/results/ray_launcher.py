"""A Hydra launcher that runs each sweep job as a Ray task, on Ray's public API only
(``ray.init``, ``ray.remote``, ``ray.wait``): ``python run.py -m hydra/launcher=ray ...``.

It connects to a running cluster (``ray start --head`` on this machine, ``ray start --address=...``
on others; ``address: auto``) or, with ``address: null``, starts a local one for the sweep, bound to
127.0.0.1 (``connect``; ``auto`` finding no cluster says how to start one, in one line). Jobs run
in the driver's working directory, so the sweep directory must be on a filesystem every node sees
(as on Slurm). Why not the ``hydra-ray-launcher`` plugin: it pins ``cloudpickle<3``, which joblib
(the local launcher) needs at ≥ 3, and brings boto3 and ``ray[default]`` for its AWS mode."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from hydra.core.utils import JobReturn

from forge.core.errors import ENVIRONMENT_EXIT_CODE, CommandError
from forge.results.launcher import JobArgs, SweepLauncher, execute_job

log = logging.getLogger(__name__)
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
HOW_TO_START = (
    "give hydra.launcher.address=null to start a local one on 127.0.0.1 for this sweep, or start one with "
    "`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head` (127.0.0.1) or `ray start --head` (network)"
)


def _job_on_node(cwd: str, *args: Any) -> tuple[int, JobReturn, str]:
    import ray

    os.chdir(cwd)
    idx, ret = execute_job(*args)
    return idx, ret, ray.get_runtime_context().get_node_id()


def connect(address: str | None) -> None:
    """``ray.init`` on ``address``: ``null`` starts a local cluster for the sweep, bound to 127.0.0.1;
    ``auto`` (or an address) with no cluster there is a one-line ``CommandError`` (exit 3) that says
    how to start one."""
    if address is None:
        # Ray 2.x resolves 127.0.0.1 to the machine's network address unless clusters are off, which
        # keeps every process of this one-machine cluster on the loopback (read when ray is imported)
        os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    try:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, include_dashboard=False)
    except ConnectionError as exc:
        msg = f"hydra.launcher.address={address}: no Ray cluster running ({first_line(exc)}); {HOW_TO_START}"
        raise CommandError(msg, ENVIRONMENT_EXIT_CODE) from None


def first_line(exc: BaseException) -> str:
    """The first sentence of ``exc``'s message."""
    text = " ".join(str(exc).split())
    return text.split(". ")[0].rstrip(".") or type(exc).__name__


class RayLauncher(SweepLauncher):
    """``address``: the cluster to join (``auto``: the one ``ray start`` left running; null: a new
    local one on 127.0.0.1); ``num_cpus``: CPUs Ray reserves per job, which bounds
    how many run at once;
    ``wall_jobs: serial``: each wall-clock job is submitted alone, after the parallel jobs are done
    and the one before it has finished (nothing else of the sweep runs anywhere on the cluster
    meanwhile); ``parallel``: with the rest."""

    def __init__(
        self,
        address: str | None = "auto",
        num_cpus: float = 1.0,
        job_overrides: Sequence[str] = (),
        progress: bool = True,
        wall_jobs: str = "serial",
    ) -> None:
        super().__init__(job_overrides, progress, wall_jobs)
        self.address = address
        self.num_cpus = num_cpus
        self.where = f"on Ray (address={address}, num_cpus={num_cpus} per job)"

    def parallelism(self, n: int) -> str:
        return f"in parallel as Ray tasks of num_cpus={self.num_cpus} each (address={self.address})"

    def serial_description(self) -> str:
        return "one Ray task at a time, after the parallel jobs, nothing else of the sweep running"

    def _execute(self, together: list[JobArgs], one_by_one: list[JobArgs]) -> Iterator[tuple[int, JobReturn]]:
        connect(self.address)  # before this process imports ray (see connect)
        import ray

        try:
            remote = ray.remote(num_cpus=self.num_cpus, max_retries=0)(_job_on_node)
            yield from self._wait_all(remote, together)
            for a in one_by_one:
                yield from self._wait_all(remote, [a])
        finally:
            ray.shutdown()

    def _run(self, args: list[JobArgs]) -> Iterable[tuple[int, JobReturn]]:
        return self._execute(args, [])

    @staticmethod
    def _wait_all(remote: Any, args: list[JobArgs]) -> Iterator[tuple[int, JobReturn]]:
        import ray

        pending = [remote.remote(os.getcwd(), *a) for a in args]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            idx, ret, node = ray.get(done[0])
            log.info(f"\tjob #{idx} ran on Ray node {node}")
            yield idx, ret
