"""``launch.json``: how forge's launchers ran a sweep's jobs, for the sweep report.

Written into the sweep directory by ``forge.results.launcher`` (one entry per job, appended when a
sweeper launches several batches): which launcher, ``wall_jobs`` (serial or parallel), how the
parallel jobs ran and how the jobs run alone did, and per job its number, overrides, clock
(``wall`` or ``simulated``) and whether it ran ``alone`` or ``parallel``. A launcher that is not
forge's (``hydra/launcher=slurm``, Hydra's basic one) writes none, and the report says so."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

LAUNCH_FILE = "launch.json"


@dataclass(frozen=True)
class JobRecord:
    num: int
    overrides: list[str]
    clock: str  # wall | simulated
    ran: str  # alone | parallel


@dataclass(frozen=True)
class LaunchRecord:
    launcher: str
    wall_jobs: str  # serial | parallel
    parallel: str  # how the jobs run together ran, in words
    serial: str  # how the jobs run alone ran, in words
    jobs: list[JobRecord] = field(default_factory=list)


def _record_from(data: dict[str, Any]) -> LaunchRecord:
    jobs = [JobRecord(**j) for j in data.get("jobs", [])]
    return LaunchRecord(**{**{k: v for k, v in data.items() if k != "jobs"}, "jobs": jobs})


def read_launch_record(sweep_dir: Path) -> LaunchRecord | None:
    """The sweep's record, or None when forge's launchers did not run it."""
    path = Path(sweep_dir) / LAUNCH_FILE
    if not path.is_file():
        return None
    return _record_from(json.loads(path.read_text()))


def append_launch_record(sweep_dir: Path, record: LaunchRecord) -> LaunchRecord:
    """Write ``record`` to ``sweep_dir``, after the jobs of an earlier batch of the same sweep (a job
    number launched again replaces its earlier entry)."""
    earlier = read_launch_record(sweep_dir)
    nums = {j.num for j in record.jobs}
    merged = LaunchRecord(
        launcher=record.launcher,
        wall_jobs=record.wall_jobs,
        parallel=record.parallel,
        serial=record.serial,
        jobs=[*(j for j in (earlier.jobs if earlier else []) if j.num not in nums), *record.jobs],
    )
    (Path(sweep_dir) / LAUNCH_FILE).write_text(json.dumps(asdict(merged), indent=2))
    return merged
