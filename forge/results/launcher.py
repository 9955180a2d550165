"""forge's Hydra launchers: one sweep-level progress bar and per-job overrides (``progress=false`` by
default, so the jobs' own bars stay quiet), with the jobs run by an executor:

- ``LocalLauncher``: parallel worker processes (joblib/loky); without joblib, one after another
  in-process. ``conf/hydra/launcher/local.yaml``; ``python run.py -m scheduler=fcfs,priority ...``.
- ``RayLauncher`` (``forge.results.ray_launcher``): one Ray task per job on a running Ray cluster.

Wall-clock jobs measure the machine, so by default (``wall_jobs: serial``) a job whose composed
config has a wall clock runs alone: the simulated-clock (and profiled-clock) jobs first, in
parallel, then the wall-clock ones one at a time. ``wall_jobs: parallel`` runs them with the rest
(their timings then contend for the cores; the sweep report says so). How the jobs ran is written
to the sweep directory's ``launch.json`` (``forge.results.launch_record``), which the sweep report reads.

Every launcher returns Hydra's ``JobReturn`` list in job order, so the sweep callback
(``forge.results.sweep``) gathers the same ``sweep.parquet`` whichever ran the jobs."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, filter_overrides, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from hydra.utils import get_object
from omegaconf import DictConfig, open_dict
from tqdm import tqdm

from forge.results.launch_record import JobRecord, LaunchRecord, append_launch_record
from forge.results.redact import redact_overrides, secret_values

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
WALL_JOBS = ("serial", "parallel")


def job_clock(hydra_context: HydraContext, config: DictConfig, overrides: Sequence[str]) -> str:
    """``simulated`` when the job's composed ``clock`` is a simulated one (its class's ``simulated``:
    the simulated and profiled clocks), else ``wall``; a config that does not compose counts as
    wall (it runs alone, and fails there with its own error)."""
    try:
        cfg = hydra_context.config_loader.load_sweep_config(config, list(overrides))
        clock = get_object(str(cfg.clock._target_))
    except Exception:
        return "wall"
    return "simulated" if getattr(clock, "simulated", False) else "wall"


# top-level settings that are not config groups: they cannot choose the clock
_SCALAR_KEYS = frozenset({"seed", "mode", "progress", "report", "output_dir"})


def _clock_deciding(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides that can change a job's clock: ``clock`` itself, ``clock.*``, and every group
    choice (a group's defaults may pick the clock); not ``seed`` or a dotted setting elsewhere."""
    keys = [(o, o.split("=", 1)[0].lstrip("+~")) for o in overrides]
    return tuple(o for o, k in keys if k.startswith("clock") or ("." not in k and k not in _SCALAR_KEYS))


def job_clocks(hydra_context: HydraContext, config: DictConfig, jobs: Sequence[Sequence[str]]) -> list[str]:
    """``job_clock`` of every job, composing once per distinct set of clock-deciding overrides (a
    composition costs ~0.05-0.3 s; a seeds sweep needs one per configuration, not per seed)."""
    known: dict[tuple[str, ...], str] = {}
    for overrides in jobs:
        key = _clock_deciding(overrides)
        if key not in known:
            known[key] = job_clock(hydra_context, config, overrides)
    return [known[_clock_deciding(o)] for o in jobs]


class SweepLauncher(Launcher):
    """The shared launcher: ``job_overrides`` are appended to every job's overrides unless the sweep
    already sets that key; ``progress``: show the sweep-level bar; ``wall_jobs``: ``serial`` (run
    each wall-clock job alone) or ``parallel``. A subclass's ``_run`` executes ``execute_job(*args)``
    for every element of ``args`` in parallel and yields its ``(index, JobReturn)`` results in any
    order; ``_run_serial`` executes them one after another; ``where`` names the executor in the log
    and ``parallelism`` says how ``_run`` ran ``n`` jobs (for ``launch.json``)."""

    where = "locally"

    def __init__(self, job_overrides: Sequence[str] = (), progress: bool = True, wall_jobs: str = "serial") -> None:
        if wall_jobs not in WALL_JOBS:
            raise ValueError(f"hydra.launcher.wall_jobs={wall_jobs!r}: must be serial or parallel")
        self.job_overrides = list(job_overrides)
        self.progress = progress
        self.wall_jobs = wall_jobs
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
        clocks = job_clocks(self.hydra_context, self.config, jobs)
        log.info(f"Launching {len(jobs)} jobs {self.where}, sweep output dir: {sweep_dir}")
        for idx, (overrides, clock) in enumerate(zip(jobs, clocks, strict=True)):
            log.info(f"\t#{initial_job_idx + idx} : {' '.join(filter_overrides(overrides))} ({clock} clock)")
        state = Singleton.get_state()
        args: list[JobArgs] = [
            (initial_job_idx + i, o, self.hydra_context, self.config, self.task_function, state)
            for i, o in enumerate(jobs)
        ]
        alone = [self.wall_jobs == "serial" and clock == "wall" for clock in clocks]
        together = [a for a, solo in zip(args, alone, strict=True) if not solo]
        one_by_one = [a for a, solo in zip(args, alone, strict=True) if solo]
        results: dict[int, JobReturn] = {}
        with tqdm(total=len(jobs), desc="sweep", unit="run", disable=not self.progress) as bar:
            for idx, ret in self._execute(together, one_by_one):
                results[idx] = ret
                bar.update(1)
        self._record(sweep_dir, args, clocks, alone, len(together))
        return [results[initial_job_idx + i] for i in range(len(jobs))]

    def _execute(self, together: list[JobArgs], one_by_one: list[JobArgs]) -> Iterator[tuple[int, JobReturn]]:
        """``together`` in parallel, all of them done before the first of ``one_by_one`` starts."""
        return chain(self._run(together) if together else (), self._run_serial(one_by_one))

    def _run_serial(self, args: list[JobArgs]) -> Iterator[tuple[int, JobReturn]]:
        for a in args:
            yield from self._run([a])

    def _record(
        self, sweep_dir: Path, args: list[JobArgs], clocks: list[str], alone: list[bool], n_together: int
    ) -> None:
        secrets = secret_values({}, [o for a in args for o in a[1]])  # a key given on the command line
        jobs = [
            JobRecord(
                num=a[0], overrides=redact_overrides(a[1], secrets), clock=clock, ran="alone" if solo else "parallel"
            )
            for a, clock, solo in zip(args, clocks, alone, strict=True)
        ]
        record = LaunchRecord(
            launcher=type(self).__name__,
            wall_jobs=self.wall_jobs,
            parallel=self.parallelism(n_together),
            serial=self.serial_description(),
            jobs=jobs,
        )
        append_launch_record(sweep_dir, record)

    def parallelism(self, n: int) -> str:
        """How ``_run`` ran ``n`` jobs at once, in words."""
        return f"{n} jobs {self.where}"

    def serial_description(self) -> str:
        """Where ``_run_serial`` runs each job alone, in words."""
        return f"one at a time {self.where}"

    @abstractmethod
    def _run(self, args: list[JobArgs]) -> Iterable[tuple[int, JobReturn]]: ...


class LocalLauncher(SweepLauncher):
    """Jobs in ``n_jobs`` local worker processes (-1 = one per core); jobs run alone
    (``wall_jobs: serial``) run in this process, one after another, after the parallel ones."""

    def __init__(
        self, n_jobs: int = -1, job_overrides: Sequence[str] = (), progress: bool = True, wall_jobs: str = "serial"
    ) -> None:
        super().__init__(job_overrides, progress, wall_jobs)
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

    def _run_serial(self, args: list[JobArgs]) -> Iterator[tuple[int, JobReturn]]:
        return (execute_job(*a) for a in args)

    def parallelism(self, n: int) -> str:
        try:
            from joblib import effective_n_jobs
        except ImportError:
            return "one at a time in the launcher's process (joblib not installed)"
        workers = min(effective_n_jobs(self.n_jobs), max(n, 1))
        return f"in parallel, {workers} worker process{'es' if workers != 1 else ''} (n_jobs={self.n_jobs})"

    def serial_description(self) -> str:
        return "one at a time in the launcher's process, after the parallel jobs"
