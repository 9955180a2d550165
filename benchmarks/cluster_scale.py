"""How a simulated cluster's cost grows with the workload: CPU seconds and peak RSS of one
``python run.py`` child per size, every replica an H100 running Llama-3-8B's cost (issue 32's scale
target: 1,000,000 requests across 16 replicas in <= 60 CPU-s and <= 4 GB).

    python -m benchmarks.cluster_scale                       # 10k, 100k, 1M requests, 16 replicas
    python -m benchmarks.cluster_scale --sizes 10000 --replicas 16 --set router=least_outstanding

Each size runs in a fresh child (``model=synthetic clock=simulated clock.model=llama-3-8b
workload=sharegpt``, arrivals at ``--rate-per-replica`` x replicas req/s, ``report=false``: the run
directory's parquet files are written); the child's user + system CPU seconds and peak RSS come from
``resource.getrusage(RUSAGE_CHILDREN)`` after it exits. Prints one JSON line per size."""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(size: int, replicas: int, rate: float, extra: list[str]) -> dict[str, Any]:
    """One child run of ``size`` requests: its CPU seconds, peak RSS (MiB) and wall seconds."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "run.py", "model=synthetic", "clock=simulated", "clock.model=llama-3-8b",
            "workload=sharegpt", f"workload.num_requests={size}", f"workload.arrivals.rate={rate}",
            f"cluster.replicas={replicas}", "progress=false", "report=false", f"hydra.run.dir={tmp}", *extra,
        ]  # fmt: skip
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"size {size} failed: {proc.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "summary.json").read_text())
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "requests": size,
        "replicas": replicas,
        "cpu_s": round(cpu, 2),
        "peak_rss_mib": round(after.ru_maxrss / 1024, 1),  # Linux: KiB; the largest child so far
        "wall_s": round(wall, 2),
        "simulated_s": round(summary["duration_s"], 3),
        "steps": summary["num_steps"],
        "commit": summary["commit"],
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}",
        "overrides": extra,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument(
        "--rate-per-replica", type=float, default=30.0, help="req/s per replica (an H100 saturates near 37)"
    )
    parser.add_argument("--set", action="append", default=[], help="another run.py override (repeatable)")
    args = parser.parse_args(argv)
    for size in sorted(args.sizes):  # ascending: ru_maxrss of the children is a running maximum
        print(json.dumps(measure(size, args.replicas, args.rate_per_replica * args.replicas, args.set)), flush=True)


if __name__ == "__main__":
    main()
