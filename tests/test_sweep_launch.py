"""How ``python run.py -m`` runs a sweep's jobs (issue 30): wall-clock jobs one at a time, never
overlapping another job in time (read from the ``timing.json`` every run writes), simulated jobs
in parallel, and the sweep report saying which; a seed list that is not integers is a one-line
config error; a wall-clock run records its torch threads and the load average."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SIMULATED = ["model=synthetic", "clock=simulated", "workload.num_requests=300", "workload.arrivals.rate=1000"]
# each wall-clock run lasts ~1 s, mostly waiting for arrivals (4 requests at 4 req/s)
SMALL = ["model=synthetic", "workload.num_requests=4", "workload.arrivals.rate=4"]

Timing = tuple[str, float, float]


def multirun(sweep_dir: Path, *overrides: str) -> Path:
    cmd = [sys.executable, "run.py", "-m", "report=false", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return sweep_dir


def timings(sweep_dir: Path) -> dict[str, Timing]:
    """Each run's clock and the start and end it recorded."""
    out = {}
    for path in sorted(sweep_dir.glob("*/timing.json")):
        t = json.loads(path.read_text())
        clock = json.loads((path.parent / "summary.json").read_text())["clock"]
        out[path.parent.name] = (clock, t["started_at"], t["ended_at"])
    return out


def overlap(a: Timing, b: Timing) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_wall_clock_jobs_never_overlap_and_the_report_says_so(tmp_path: Path) -> None:
    sweep_dir = multirun(tmp_path, *SMALL, "clock=wall,simulated", "scheduler=fcfs,priority", "hydra.launcher.n_jobs=2")
    runs = timings(sweep_dir)
    assert sorted(clock for clock, _, _ in runs.values()) == ["simulated", "simulated", "wall", "wall"]
    for name, run in runs.items():
        if run[0] == "wall":
            others = [o for o, other in runs.items() if o != name and overlap(run, other)]
            assert others == [], f"wall-clock run {name} overlapped {others}"
    report = (sweep_dir / "sweep_report.md").read_text()
    assert "- 2 wall-clock jobs ran one at a time in the launcher's process, after the parallel jobs." in report
    assert "- 2 jobs ran in parallel, 2 worker processes (n_jobs=2)." in report
    assert "no wall-clock run overlapped another run" in report
    assert "`wall_jobs: serial`" in report


def test_simulated_jobs_still_run_in_parallel(tmp_path: Path) -> None:
    sweep_dir = multirun(tmp_path, *SIMULATED, "scheduler=fcfs,priority,sjf,sarathi", "hydra.launcher.n_jobs=2")
    runs = list(timings(sweep_dir).values())
    assert len(runs) == 4
    assert any(overlap(a, b) for i, a in enumerate(runs) for b in runs[i + 1 :])
    report = (sweep_dir / "sweep_report.md").read_text()
    assert "- 4 jobs ran in parallel, 2 worker processes (n_jobs=2)." in report
    assert "at most 2 runs running at once" in report
    assert "wall-clock jobs ran" not in report


def test_wall_jobs_parallel_is_an_explicit_choice_the_report_warns_about(tmp_path: Path) -> None:
    overrides = [
        "clock=wall",
        "scheduler=fcfs,priority",
        "hydra.launcher.n_jobs=2",
        "hydra.launcher.wall_jobs=parallel",
    ]
    sweep_dir = multirun(tmp_path, *SMALL, *overrides)
    report = (sweep_dir / "sweep_report.md").read_text()
    assert "`wall_jobs: parallel`" in report
    assert "- 2 jobs ran in parallel, 2 worker processes (n_jobs=2)." in report
    assert "> **warning (sweep):** 2 wall-clock jobs ran in parallel (hydra.launcher.wall_jobs=parallel)" in report


@pytest.mark.parametrize("seeds", ["seed=a,b", "seed=1.5", "seed=1,2.5", "seed=true,2"])
def test_a_seed_list_that_is_not_integers_is_a_one_line_config_error(seeds: str, tmp_path: Path) -> None:
    cmd = [sys.executable, "run.py", "-m", "model=synthetic", "clock=simulated", seeds, f"hydra.sweep.dir={tmp_path}"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: ") and "seed=" in lines[0], proc.stderr
    assert "Integer" in lines[0]
    assert not list(tmp_path.glob("*/summary.json"))  # no job ran


def test_a_wall_clock_run_records_its_threads_and_the_load(tmp_path: Path) -> None:
    cmd = [sys.executable, "run.py", "model=tiny", "workload.num_requests=2", "progress=false"]
    proc = subprocess.run([*cmd, f"hydra.run.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["clock"] == "wall"
    assert summary["torch_threads"] == 1  # conf/backend/torch.yaml's default
    assert summary["load_avg_start"] >= 0 and summary["load_avg_end"] >= 0
    assert "wall-clock conditions       1 torch threads, load avg " in proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert "| torch_threads | 1 |" in report and "| load_avg_start | " in report


def test_backend_num_threads_is_honoured_or_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "run.py", "model=tiny", "workload.num_requests=2", "progress=false", "report=false"]
    proc = subprocess.run(
        [*cmd, "backend.num_threads=2", f"hydra.run.dir={tmp_path / 'two'}"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((tmp_path / "two" / "summary.json").read_text())["torch_threads"] == 2
    proc = subprocess.run(
        [*cmd, "backend.num_threads=0", f"hydra.run.dir={tmp_path / 'zero'}"], cwd=REPO, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "backend.num_threads" in proc.stderr, proc.stderr[-2000:]


def test_an_unknown_wall_jobs_setting_is_a_one_line_config_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "run.py", "-m", "model=synthetic", "clock=simulated", "hydra.launcher.wall_jobs=maybe"]
    proc = subprocess.run([*cmd, f"hydra.sweep.dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == "config error: hydra.launcher.wall_jobs='maybe': must be serial or parallel"
