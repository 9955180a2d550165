"""Launchers: the same sweep run by forge's local launcher, by forge's Ray launcher on a two-node Ray
cluster started on this machine as a user would (``ray start --head``, then ``ray start --address``),
and by submitit's local executor (``hydra/launcher=submitit_local``, the Slurm plugin's code path
without a cluster); each gathered ``sweep.parquet`` compared with the local one, row for row."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pandas as pd

from experiments.common import REPO, section, table, write_readme, write_results
from forge.results.ray_launcher import LOOPBACK_ENV

SWEEP = ["model=synthetic", "clock=simulated", "report=false", "progress=false"]
POINTS = {"tiny": ["scheduler=fcfs,priority", "seed=0"], "small": ["scheduler=fcfs,priority,sjf", "seed=0,1"]}
LAUNCHERS = {
    "local": ["hydra.launcher.n_jobs=1"],
    "ray": ["hydra/launcher=ray"],
    "submitit_local": ["hydra/launcher=submitit_local"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def ray_cluster(nodes: int = 2) -> Iterator[str]:
    """``nodes`` Ray nodes of one CPU each on this machine; yields the head's address. ``ray stop``
    at the end stops every Ray process of this user."""
    ray = shutil.which("ray")
    if ray is None:
        raise RuntimeError("ray is not installed (pip install -e '.[sweep]')")
    address = f"127.0.0.1:{free_port()}"
    head = [ray, "start", "--head", f"--port={address.rsplit(':', 1)[1]}", "--num-cpus=1"]
    env = {**os.environ, LOOPBACK_ENV: "0"}  # every node on 127.0.0.1, not the machine's network address
    try:
        head += ["--include-dashboard=false", "--disable-usage-stats"]
        subprocess.run(head, check=True, capture_output=True, env=env)
        for _ in range(nodes - 1):
            node = [ray, "start", f"--address={address}", "--num-cpus=1", "--disable-usage-stats"]
            subprocess.run(node, check=True, capture_output=True, env=env)
        yield address
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True)


def multirun(sweep_dir: Path, overrides: Sequence[str]) -> tuple[pd.DataFrame, str, float]:
    """Run ``run.py -m`` with ``overrides``: the gathered sweep (by run), the Hydra log, wall seconds."""
    cmd = [sys.executable, "run.py", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(overrides)} failed:\n{proc.stderr[-3000:]}")
    df = pd.read_parquet(sweep_dir / "sweep.parquet").sort_values("run", ignore_index=True)
    return df, proc.stdout + proc.stderr, wall


def differing_columns(got: pd.DataFrame, local: pd.DataFrame) -> list[str]:
    if len(got) != len(local) or list(got.columns) != list(local.columns):
        return ["(shape or columns)"]
    return [c for c in local.columns if not got[c].equals(local[c])]


def run(out: Path, size: str) -> None:
    sweep = [*SWEEP, *POINTS[size]]
    load = os.getloadavg()
    rows, nodes_of_jobs = [], []
    with tempfile.TemporaryDirectory() as tmp, ray_cluster() as address:
        runs = {}
        for name, launcher in LAUNCHERS.items():
            extra = [f"hydra.launcher.address={address}"] if name == "ray" else []
            runs[name] = multirun(Path(tmp) / name, [*launcher, *extra, *sweep])
        local = runs["local"][0]
        for name, (df, _log, wall) in runs.items():
            diff = differing_columns(df, local)
            rows.append({"launcher": name, "jobs": len(df), "wall_s": wall, "rows_equal_local": not diff})
            rows[-1]["differing_columns"] = ", ".join(diff) or "none"
        for job, node in re.findall(r"job #(\d+) ran on Ray node (\w+)", runs["ray"][1]):
            nodes_of_jobs.append({"job": int(job), "ray_node": node[:12]})
    result = pd.DataFrame(rows)
    write_results(out, result)
    placement = pd.DataFrame(nodes_of_jobs).sort_values("job")
    body = [
        f"Load average before the sweeps: {', '.join(f'{x:.2f}' for x in load)} (2 shared cores; wall times are"
        " single runs, only the equality is the result).",
        "",
        *section("Sweep", [f"`run.py -m {' '.join(sweep)}` with each launcher's override:"]),
        *[f"- {name}: `{' '.join(o) or '(default)'}`" for name, o in LAUNCHERS.items()],
        "",
        *section("Gathered sweep.parquet against the local launcher's", [table(result, list(result.columns))]),
        *section(
            f"Where the Ray jobs ran ({placement['ray_node'].nunique()} of 2 nodes used)",
            [table(placement, ["job", "ray_node"])],
        ),
    ]
    intro = __doc__.split("\n\n")[0].replace("\n", " ") if __doc__ else ""
    write_readme(out, "Hydra launchers: local, Ray (two nodes), submitit local", intro, body)
