"""CPU-seconds and peak memory of a cluster simulation as the number of requests grows (issue 32's Scale).

    python -m benchmarks.cluster_scale --requests 10000 100000 1000000 --replicas 16 \\
        --out reports/simulation_speed/cluster-scale.md

Each size runs ``python run.py model=synthetic clock=simulated model.timing_only=true
cluster.replicas=R workload.num_requests=N ...`` (the default Poisson workload: prompts of 16..256
tokens, outputs of 8..64, ``--rate`` requests/s over the whole cluster) in a fresh process, and
reports that child's CPU-seconds (user + sys, from ``os.wait4``: the whole process, interpreter
start-up, imports, build, workload, simulation and the parquet files) and its peak resident memory
(``ru_maxrss``), with the 1-minute load average before and after. ``--ids`` runs the id-materialising
path (``model.timing_only=false``) instead. The run directory goes to a temporary folder."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_model
from forge.results.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent


def overrides(n: int, replicas: int, rate: float, timing_only: bool, run_dir: Path) -> list[str]:
    """``run.py``'s arguments for one size."""
    return [
        "model=synthetic",
        "clock=simulated",
        f"model.timing_only={str(timing_only).lower()}",
        f"cluster.replicas={replicas}",
        f"workload.num_requests={n}",
        f"workload.arrivals.rate={rate}",
        "progress=false",
        "report=false",
        f"hydra.run.dir={run_dir}",
    ]


def measure(args: list[str]) -> dict[str, Any]:
    """One fresh ``run.py`` process: its CPU-seconds, peak RSS and the load average around it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()[0]
    child = subprocess.Popen([sys.executable, "run.py", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = child.stdout.read().decode()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"run.py {' '.join(args)} exited with {child.returncode}:\n{out}")
    return {
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "user_s": round(usage.ru_utime, 2),
        "sys_s": round(usage.ru_stime, 2),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # Linux: KiB
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def run_size(n: int, replicas: int, rate: float, timing_only: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cluster_scale_") as tmp:
        run_dir = Path(tmp) / "run"
        args = overrides(n, replicas, rate, timing_only, run_dir)
        row = measure(args)
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "requests": n,
        **row,
        "steps": summary["num_steps"],
        "simulated_s": round(summary["duration_s"], 1),
        "command": "python run.py " + " ".join(a for a in args if not a.startswith("hydra.run.dir")),
    }


def report(rows: list[dict[str, Any]], argv: list[str]) -> str:
    """A markdown table of ``rows``, with the command, machine and commit."""
    lines = [
        "# Cluster-scale simulation: CPU-seconds and peak memory",
        "",
        f"- command: `python -m benchmarks.cluster_scale {' '.join(argv)}`",
        f"- machine: {cpu_model()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}",
        f"- commit: {git_commit()}",
        "- each size a fresh `run.py` process; CPU-s = its user + sys (os.wait4), peak RSS = its ru_maxrss",
        "",
        "| requests | CPU-s | user | sys | peak RSS (MiB) | steps | simulated s | load before -> after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['requests']:,} | {r['cpu_s']} | {r['user_s']} | {r['sys_s']} | {r['peak_rss_mb']:,} "
            f"| {r['steps']:,} | {r['simulated_s']} | {r['load_before']} -> {r['load_after']} |"
        )
    lines += ["", "Each run's command:", ""] + [f"- `{r['command']}`" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--rate", type=float, default=256.0, help="arrivals per second over the whole cluster")
    parser.add_argument("--ids", action="store_true", help="the id-materialising path (model.timing_only=false)")
    parser.add_argument("--out", type=Path, help="write the markdown table here (and a .json beside it)")
    args = parser.parse_args(argv)
    rows = []
    for n in args.requests:
        row = run_size(n, args.replicas, args.rate, not args.ids)
        print(json.dumps(row), flush=True)
        rows.append(row)
    text = report(rows, sys.argv[1:] if argv is None else argv)
    print(text)
    if args.out is not None:
        args.out.write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
