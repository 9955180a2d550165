"""forge's Hydra launchers: one sweep-level progress bar and per-job overrides (``progress=false`` by
default, so the jobs' own bars stay quiet), with the jobs run by an executor:

- ``LocalLauncher``: parallel worker processes (joblib/loky); without joblib, one after another
  in-process. ``conf/hydra/launcher/local.yaml``; ``python run.py -m scheduler=fcfs,priority ...``.
- ``RayLauncher`` (``forge.results.ray_launcher``): one Ray task per job on a running Ray cluster.

Every launcher returns Hydra's ``JobReturn`` list in job order, so the sweep callback
(``forge.results.sweep``) gathers the same ``sweep.parquet`` whichever ran the jobs."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

log = logging.getLogger(__name__)


def execute_job(
    idx: int,
    overrides: Sequence[str],
    hydra_context: HydraContext,
    config: DictConfig,
    task_function: TaskFunction,
    singleton_state: dict[Any, Any],
) -> tuple[int, JobReturn]:
    setup_globals()
    Singleton.set_state(singleton_state)
    sweep_config = hydra_context.config_loader.load_sweep_config(config, list(overrides))
    with open_dict(sweep_config):
        sweep_config.hydra.job.id = f"{sweep_config.hydra.job.name}_{idx}"
        sweep_config.hydra.job.num = idx
    HydraConfig.instance().set_config(sweep_config)
    ret = run_job(
        hydra_context=hydra_context,
        config=sweep_config,
        task_function=task_function,
        job_dir_key="hydra.sweep.dir",
        job_subdir_key="hydra.sweep.subdir",
    )
    return idx, ret


JobArgs = tuple[int, Sequence[str], HydraContext, DictConfig, TaskFunction, dict[Any, Any]]


class SweepLauncher(Launcher):
    """The shared launcher: ``job_overrides`` are appended to every job's overrides unless the sweep
    already sets that key; ``progress``: show the sweep-level bar. A subclass's ``_run`` executes
    ``execute_job(*args)`` for every element of ``args`` and yields its ``(index, JobReturn)`` results
    in any order; ``where`` names the executor in the log."""

    where = "locally"

    def __init__(self, job_overrides: Sequence[str] = (), progress: bool = True) -> None:
        self.job_overrides = list(job_overrides)
        self.progress = progress
        self.config: DictConfig | None = None
        self.task_function: TaskFunction | None = None
        self.hydra_context: HydraContext | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config = config
        self.task_function = task_function
        self.hydra_context = hydra_context

    def _with_defaults(self, overrides: Sequence[str]) -> list[str]:
        keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
        return [*overrides, *(o for o in self.job_overrides if o.split("=", 1)[0].lstrip("+~") not in keys)]

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        setup_globals()
        assert self.config is not None and self.task_function is not None and self.hydra_context is not None
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        jobs = [self._with_defaults(o) for o in job_overrides]
        log.info(f"Launching {len(jobs)} jobs {self.where}, sweep output dir: {sweep_dir}")
        for idx, overrides in enumerate(jobs):
            log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        args: list[JobArgs] = [
            (initial_job_idx + i, o, self.hydra_context, self.config, self.task_function, state)
            for i, o in enumerate(jobs)
        ]
        results: dict[int, JobReturn] = {}
        with tqdm(total=len(jobs), desc="sweep", unit="run", disable=not self.progress) as bar:
            for idx, ret in self._run(args):
                results[idx] = ret
                bar.update(1)
        return [results[initial_job_idx + i] for i in range(len(jobs))]

    @abstractmethod
    def _run(self, args: list[JobArgs]) -> Iterable[tuple[int, JobReturn]]: ...


class LocalLauncher(SweepLauncher):
    """Jobs in ``n_jobs`` local worker processes (-1 = one per core)."""

    def __init__(self, n_jobs: int = -1, job_overrides: Sequence[str] = (), progress: bool = True) -> None:
        super().__init__(job_overrides, progress)
        self.n_jobs = n_jobs
        self.where = f"locally (n_jobs={n_jobs})"

    def _run(self, args: list[JobArgs]) -> Iterable[tuple[int, JobReturn]]:
        try:
            from joblib import Parallel, delayed
        except ImportError:
            log.warning("joblib not installed (pip install 'forge[sweep]'): running the sweep serially")
            return (execute_job(*a) for a in args)
        parallel = Parallel(n_jobs=self.n_jobs, backend="loky", return_as="generator_unordered")
        return parallel(delayed(execute_job)(*a) for a in args)
