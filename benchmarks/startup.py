"""Startup times: import, model load, first token, and a healthy server, each in a fresh process.

    forge bench startup [--repeats 3] [--output-dir DIR] [overrides ...]
    python -m benchmarks.startup model=tiny

The library phases are timed inside one fresh interpreter per repeat (``python -X importtime`` is
not used: it slows imports down): ``import forge`` (what ``from forge import SamplingParams`` pays),
``import forge.llm`` (engine, torch, Hydra), ``import forge.server.app`` (FastAPI on top), model load
(``LLM(*overrides)``: compose, validate, build the engine) and the first token (``generate`` of one
token). ``server healthy`` is wall time from launching ``forge serve <overrides> --port 0`` to the
first 200 from ``GET /health``. Each phase reports the minimum and the median over the repeats, and
the report records the command, the machine (CPU, cores, load average at start) and the commit.
It writes README.md and startup.json to ``--output-dir``: by default ``outputs/bench/startup-<date>-<time>``
(git-ignored), so that a measurement leaves the checkout clean; ``--output-dir reports/startup/tiny``
regenerates a committed report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.child_server import child_server
from benchmarks.machine import cpu_model
from forge.core.errors import run_main

ROOT = Path(__file__).resolve().parent.parent
PHASES = ("python", "import forge", "import forge.llm", "import forge.server.app", "model load", "first token")

# Runs in a fresh interpreter: prints one JSON line of cumulative seconds since the interpreter's start.
LIBRARY_PROBE = """
import json, sys, time
start = time.perf_counter()
marks = {"python": 0.0}
import forge
marks["import forge"] = time.perf_counter() - start
import forge.llm
marks["import forge.llm"] = time.perf_counter() - start
import forge.server.app
marks["import forge.server.app"] = time.perf_counter() - start
llm = forge.llm.LLM(*sys.argv[1:])
marks["model load"] = time.perf_counter() - start
llm.generate([[65, 66, 67]], forge.SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
marks["first token"] = time.perf_counter() - start
print(json.dumps(marks))
"""


def git_commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, cwd=ROOT
        )
    except OSError:
        return "unknown"
    return rev.stdout.strip() + (" with uncommitted work" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    cpu = cpu_model(platform.processor() or platform.machine())
    return {"cpu": cpu, "cores": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)}


def library_phases(overrides: list[str]) -> dict[str, float]:
    """Cumulative seconds at the end of each phase, plus the interpreter's own start as ``python``."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, cwd=ROOT)
    python = time.perf_counter() - t0
    proc = subprocess.run(
        [sys.executable, "-c", LIBRARY_PROBE, *overrides], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    if proc.returncode != 0:
        raise SystemExit(f"startup probe failed:\n{proc.stderr[-3000:]}")
    marks: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {name: python + marks[name] for name in PHASES}


def server_healthy(overrides: list[str], timeout_s: float = 300.0) -> float:
    """Seconds from launching ``forge serve`` to the first 200 from ``/health``."""
    cmd = [sys.executable, "-m", "forge.cli", "serve", *overrides, "--port", "0", "hydra.run.dir=/tmp/forge-startup"]
    t0 = time.perf_counter()
    with child_server(cmd, timeout_s) as (_, port):
        while time.perf_counter() - t0 < timeout_s:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        raise SystemExit("the server never became healthy")


def write_report(out_dir: Path, result: dict[str, Any]) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "startup.json").write_text(json.dumps(result, indent=2))
    m = result["machine"]
    lines = [
        f"# Startup — `{' '.join(result['overrides']) or 'model=tiny (default)'}`",
        "",
        f"Command: `{result['command']}`  ",
        f"Commit `{result['commit']}`; machine: {m['cpu']}, {m['cores']} cores, load average "
        f"{m['load_average_1m']} at start; {result['repeats']} repeats, each in a fresh process.",
        "",
        "Seconds since the process was launched, at the end of each phase (min / median over repeats):",
        "",
        "| phase | min (s) | median (s) |",
        "|---|---|---|",
        *[f"| {name} | {v['min']:.2f} | {v['median']:.2f} |" for name, v in result["phases"].items()],
        "",
    ]
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--output-dir",
        default=None,
        help="default: outputs/bench/startup-<date>-<time> (git-ignored); the committed reports/startup/... when named",
    )
    p.add_argument("--no-server", action="store_true", help="skip the forge serve measurement")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model=smollm2")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    at_start = machine()
    samples: dict[str, list[float]] = {name: [] for name in PHASES}
    if not args.no_server:
        samples["server healthy"] = []
    for _ in range(args.repeats):
        for name, seconds in library_phases(args.overrides).items():
            samples[name].append(seconds)
        if not args.no_server:
            samples["server healthy"].append(server_healthy(args.overrides))
    result = {
        "command": " ".join(["forge bench startup", *(sys.argv[1:] if argv is None else argv)]),
        "overrides": args.overrides,
        "repeats": args.repeats,
        "commit": git_commit(),
        "machine": at_start,
        "phases": {name: {"min": min(v), "median": statistics.median(v), "all": v} for name, v in samples.items()},
    }
    out_dir = Path(args.output_dir or f"outputs/bench/startup-{time.strftime('%Y%m%d-%H%M%S')}")
    path = write_report(out_dir, result)
    for name, v in result["phases"].items():
        print(f"{name:<26} min {v['min']:6.2f} s   median {v['median']:6.2f} s")
    print(f"report: {path}")
    return result


if __name__ == "__main__":
    run_main(main)
