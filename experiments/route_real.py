"""Sim vs real routing (issue 34): the same shared-prefix workload through real ``forge serve model=tiny``
backends behind ``forge route`` with each router, measured at the client by forge's bench client
(``benchmarks.serve``), and through the simulator (``cluster.replicas=N router=<same>``) with the profiled
clock calibrated on this machine by ``forge.calibrate`` (model=tiny) in the same run.

The workload is a trace this module writes (``workload=trace``): seeded Poisson arrivals, a few shared
system prompts + random suffixes (``prefix_hash``), output lengths; both sides replay its arrival times
and lengths, and the rows sharing a prefix share those tokens on both sides (the token ids themselves
are drawn by each side's tokenizer and differ, which the tiny model's step time does not depend on)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

from experiments.common import REPO, run_grid
from experiments.route_real_report import write_report
from forge.gateway.spawn import gateway

ROUTERS = ("round_robin", "least_outstanding", "power_of_two", "prefix_aware")
BACKEND = ["model=tiny", "backend.num_threads=1", "kvcache.enable_prefix_caching=true"]
SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"replicas": 2, "routers": ("round_robin", "prefix_aware"), "requests": 16, "rate": 4.0, "quick": True},
    "small": {"replicas": 3, "routers": ROUTERS, "requests": 150, "rate": 10.0, "quick": False},
}
METRICS = ("ttft", "tpot")
CLIENT_STATS = {"mean": "mean", "p50": "median", "p90": "p90"}  # the sim's name -> benchmarks.serve's


def write_trace(path: Path, n: int, rate: float, seed: int = 0) -> pd.DataFrame:
    """``n`` requests: Poisson(``rate``) arrivals, one of 4 system prompts of 384 tokens drawn 1/(i+1)
    + a 16-128 token suffix, 16-64 output tokens; written as a ``workload=trace`` CSV."""
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, 5)
    frame = pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_time": np.round(np.cumsum(rng.exponential(1 / rate, n)), 6),
            "prefix_hash": rng.choice(4, size=n, p=weights / weights.sum()),
            "prefix_len": 384,
            "input_len": 384 + rng.integers(16, 129, n),
            "output_len": rng.integers(16, 65, n),
        }
    )
    frame.to_csv(path, index=False)
    return frame


def calibrate(out: Path, quick: bool) -> Path:
    """``python -m forge.calibrate`` on model=tiny with the backends' settings; the profile's path."""
    from forge.calibrate import main as calibrate_main

    profile = out / "cpu-tiny.csv"
    calibrate_main(
        ["--model", "tiny", "--out", str(profile), "--no-validate", *(["--quick"] if quick else []), *BACKEND[1:]]
    )
    return profile


def per_backend(url: str) -> tuple[str, list[int]]:
    """The gateway's router class and the requests it sent to each backend, in backend order."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    counts = dict(re.findall(r'forge_router:requests_total\{backend="([^"]+)"\} ([0-9.]+)', text))
    state = httpx.get(f"{url}/gateway/backends", timeout=30).json()
    return str(state["router"]), [int(float(counts.get(b["url"], 0))) for b in state["backends"]]


def warm_up(url: str) -> None:
    """Two short requests straight to each backend (not through the gateway, whose counts and prefix
    record stay empty), so that no run's first request pays a fresh process's first-call costs."""
    for backend in httpx.get(f"{url}/gateway/backends", timeout=30).json()["backends"]:
        for _ in range(2):
            body = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "ignore_eos": True}
            httpx.post(f"{backend['url']}/v1/completions", json=body, timeout=60).raise_for_status()


def measure(router: str, replicas: int, trace: Path, out: Path) -> dict[str, Any]:
    """The trace through ``forge route`` over fresh backends (cold prefix caches, warmed up): the client's
    summary."""
    from benchmarks.serve import main as bench

    with gateway(["--spawn", str(replicas), *BACKEND, f"router={router}"], cwd=str(REPO)) as url:
        warm_up(url)
        argv = ["--url", url, "--workload", "trace", "--set", f"workload.path={trace}", "--output-dir", str(out)]
        summary = bench(argv)
        router_class, split = per_backend(url)
    row: dict[str, Any] = {"router": router, "side": "measured", "router_class": router_class}
    row["completed"] = summary["completed"]
    row["failed"] = summary["failed"]
    for metric in METRICS:
        for ours, theirs in CLIENT_STATS.items():
            row[f"{ours}_{metric}_ms"] = summary[f"{theirs}_{metric}_ms"]
    row["requests_per_replica"] = "/".join(map(str, split))
    return row


def simulate(routers: tuple[str, ...], replicas: int, trace: Path, profile: Path) -> list[dict[str, Any]]:
    base = [*BACKEND, "clock=profiled", f"clock.profile={profile}", "workload=trace", f"workload.path={trace}"]
    df = run_grid("route_real", base, [[f"cluster.replicas={replicas}", f"router={r}"] for r in routers])
    rows = []
    for router, run_dir in zip(routers, sorted(df["run_dir"]), strict=True):  # run_grid numbers runs in order
        got = df[df["run_dir"] == run_dir].iloc[0]
        row: dict[str, Any] = {"router": router, "side": "simulated", "router_class": str(got["router"])}
        row["completed"] = int(got["num_requests"])
        row["failed"] = 0
        for metric in METRICS:
            for stat in CLIENT_STATS:
                row[f"{stat}_{metric}_ms"] = float(got[f"{stat}_{metric}_ms"])
        served = pd.read_parquet(Path(run_dir) / "requests.parquet", columns=["replica"])["replica"]
        row["requests_per_replica"] = "/".join(str(int((served == i).sum())) for i in range(replicas))
        rows.append(row)
    return rows


def run(out: Path, size: str) -> None:
    spec = SIZES[size]
    out.mkdir(parents=True, exist_ok=True)
    work = REPO / "outputs" / "studies" / "route_real_client"
    work.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    trace = work / "trace.csv"
    write_trace(trace, spec["requests"], spec["rate"])
    profile = calibrate(out, spec["quick"])
    rows = [measure(r, spec["replicas"], trace, work / r) for r in spec["routers"]]
    rows += simulate(spec["routers"], spec["replicas"], trace, profile)
    context = {"size": size, **spec, "load_start": load_start, "load_end": os.getloadavg()}
    context["wall_s"] = time.perf_counter() - t0
    write_report(pd.DataFrame(rows), out, context)
