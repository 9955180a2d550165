"""What ``forge route`` adds at the client: the same requests sent straight to a backend and through the
gateway, alternating, in one run (forge's ``vllm bench serve``-style client, ``benchmarks.serve``).

    python -m benchmarks.gateway_overhead [--rounds 3] [--num-prompts 40] [--request-rate 8] [--output-dir DIR]

One ``forge serve model=tiny`` backend and one gateway (round robin over it) on loopback ports; each
round runs the client direct, then via the gateway (the order alternates between rounds). Reports each
run's TTFT and ITL (mean, median, p90), the failures, and the gateway's added latency (gateway −
direct per round, then the median over rounds), with the load average; writes ``overhead.csv`` and
``overhead.md`` into ``--output-dir`` (default ``outputs/gateway_overhead/<time>``)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import pandas as pd

from forge.gateway.spawn import gateway, spawned
from forge.results.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ["mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms", "mean_itl_ms", "median_itl_ms", "p90_itl_ms"]


def client_run(url: str, args: argparse.Namespace, out: Path) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.serve",
        "--url",
        url,
        "--workload",
        "poisson",
        "--num-prompts",
        str(args.num_prompts),
        "--request-rate",
        str(args.request_rate),
        "--seed",
        "0",
        "--output-dir",
        str(out),
        "--set",
        "workload.input_len.high=128",
        "workload.output_len.low=32",
        "workload.output_len.high=64",
    ]
    subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True, timeout=600)
    summary = json.loads((out / "summary.json").read_text())
    return {k: summary[k] for k in ["completed", "failed", *COLUMNS]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gateway_overhead", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--request-rate", type=float, default=8.0)
    ap.add_argument("--output-dir", default=None)
    args = ap.parse_args(argv)
    out = Path(args.output_dir or f"outputs/gateway_overhead/{datetime.now():%Y-%m-%d_%H-%M-%S}")
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    load_start = os.getloadavg()
    with (
        spawned(1, ["model=tiny"]) as (backend,),
        gateway(["--backend", backend.url]) as via,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for r in range(args.rounds):
            order = [("direct", backend.url), ("gateway", via)]
            for path, url in order if r % 2 == 0 else order[::-1]:
                rows.append({"round": r, "path": path, **client_run(url, args, Path(tmp) / f"{r}-{path}")})
                print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "overhead.csv", index=False)
    (out / "overhead.md").write_text(report(frame, args, load_start, os.getloadavg()))
    print((out / "overhead.md").read_text())


def report(
    frame: pd.DataFrame, args: argparse.Namespace, load_start: tuple[float, ...], load_end: tuple[float, ...]
) -> str:
    direct = frame[frame.path == "direct"].set_index("round")[COLUMNS]
    via = frame[frame.path == "gateway"].set_index("round")[COLUMNS]
    added = (via - direct).median()

    total = int(frame.completed.sum() + frame.failed.sum())

    def failed(path: str) -> int:
        return int(frame[frame.path == path].failed.sum())

    lines = [
        "# forge route: added latency at the client",
        "",
        f"- command: `python -m benchmarks.gateway_overhead --rounds {args.rounds} --num-prompts {args.num_prompts} "
        f"--request-rate {args.request_rate}`",
        f"- commit `{git_commit(ROOT)}`, machine {platform.node()} {platform.machine()}, {os.cpu_count()} cores, "
        f"load average {load_start[0]:.2f} -> {load_end[0]:.2f}",
        f"- failures: direct {failed('direct')}, gateway {failed('gateway')} of {total} requests",
        "",
        "| metric (ms) | direct, median of rounds | gateway, median of rounds | gateway − direct, median of rounds |",
        "|---|---|---|---|",
    ]
    for col in COLUMNS:
        lines.append(f"| {col} | {direct[col].median():.2f} | {via[col].median():.2f} | {added[col]:+.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
