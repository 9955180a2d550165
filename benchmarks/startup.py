"""Startup times: import, model load, first token, and a healthy server, each in a fresh process.

    forge bench startup [--repeats 3] [--output-dir DIR] [overrides ...]
    python -m benchmarks.startup model=tiny

The library phases are timed inside one fresh interpreter per repeat (``python -X importtime`` is
not used: it slows imports down): ``import forge`` (what ``from forge import SamplingParams`` pays),
``import forge.llm`` (engine, torch, Hydra), ``import forge.server.app`` (FastAPI on top), model load
(``LLM(*overrides)``: compose, validate, build the engine) and the first token (``generate`` of one
token). ``server healthy`` is wall time from launching ``forge serve <overrides> --port 0`` to the
first 200 from ``GET /health``; ``forge run`` is the wall time of ``forge run <overrides>`` (the
default job when none are given: it writes its run directory, report and plots included, to a
temporary directory). Each phase reports the minimum and the median over the repeats, and the
report records the command, the machine (CPU, cores, load average at start) and the commit. Wall
time measures the neighbours too; the CPU seconds (user + sys) of ``forge run``'s process and of the
server's process until it is healthy (``/proc``; Linux) do not, and are reported beside it.
It writes README.md and startup.json to ``--output-dir``: by default ``outputs/bench/startup-<date>-<time>``
(git-ignored), so that a measurement leaves the checkout clean; ``--output-dir reports/startup/tiny``
regenerates a committed report.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
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


def process_cpu(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used so far (``/proc/PID/stat``), None without procfs."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_healthy(overrides: list[str], timeout_s: float = 300.0) -> tuple[float, float | None]:
    """Seconds from launching ``forge serve`` to the first 200 from ``/health``, and the CPU
    seconds the server's process had used by then."""
    cmd = [sys.executable, "-m", "forge.cli", "serve", *overrides, "--port", "0", "hydra.run.dir=/tmp/forge-startup"]
    t0 = time.perf_counter()
    with child_server(cmd, timeout_s) as (proc, port):
        while time.perf_counter() - t0 < timeout_s:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                    return time.perf_counter() - t0, process_cpu(proc.pid)
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        raise SystemExit("the server never became healthy")


def forge_run(overrides: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of ``forge run <overrides>``, its run directory written to
    a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="forge-startup-run-") as run_dir:
        cmd = [sys.executable, "-m", "forge.cli", "run", *overrides, f"hydra.run.dir={run_dir}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=600)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"forge run failed:\n{proc.stderr[-3000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _table(title: str, unit: str, stats: dict[str, dict[str, float]]) -> list[str]:
    return [
        title,
        "",
        f"| phase | min ({unit}) | median ({unit}) |",
        "|---|---|---|",
        *[f"| {name} | {v['min']:.2f} | {v['median']:.2f} |" for name, v in stats.items()],
        "",
    ]


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
        *_table("Seconds since the process was launched, at the end of each phase (min / median over repeats):",
                "s", result["phases"]),
    ]  # fmt: skip
    if result.get("cpu"):
        lines += _table("CPU seconds (user + sys) of the process, which the machine's load does not inflate as it "
                        "does wall time:", "CPU-s", result["cpu"])  # fmt: skip
    path = out_dir / "README.md"
    path.write_text("\n".join(lines))
    return path


def _stats(samples: dict[str, list[float]]) -> dict[str, dict[str, Any]]:
    return {name: {"min": min(v), "median": statistics.median(v), "all": v} for name, v in samples.items() if v}


def sample(args: argparse.Namespace) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Wall seconds of each phase, and CPU seconds of ``forge run`` and the healthy server, per repeat."""
    wall: dict[str, list[float]] = {name: [] for name in (*PHASES, "server healthy", "forge run")}
    cpu: dict[str, list[float]] = {"server healthy": [], "forge run": []}
    for _ in range(args.repeats):
        for name, seconds in library_phases(args.overrides).items():
            wall[name].append(seconds)
        if not args.no_server:
            seconds, server_cpu = server_healthy(args.overrides)
            wall["server healthy"].append(seconds)
            if server_cpu is not None:
                cpu["server healthy"].append(server_cpu)
        if not args.no_run:
            seconds, run_cpu = forge_run(args.overrides)
            wall["forge run"].append(seconds)
            cpu["forge run"].append(run_cpu)
    return wall, cpu


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--output-dir",
        default=None,
        help="default: outputs/bench/startup-<date>-<time> (git-ignored); the committed reports/startup/... when named",
    )
    p.add_argument("--no-server", action="store_true", help="skip the forge serve measurement")
    p.add_argument("--no-run", action="store_true", help="skip the forge run measurement")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. model=smollm2")
    args = p.parse_args(argv)
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    at_start = machine()
    wall, cpu = sample(args)
    result = {
        "command": " ".join(["forge bench startup", *(sys.argv[1:] if argv is None else argv)]),
        "overrides": args.overrides,
        "repeats": args.repeats,
        "commit": git_commit(),
        "machine": at_start,
        "phases": _stats(wall),
        "cpu": _stats(cpu),
    }
    out_dir = Path(args.output_dir or f"outputs/bench/startup-{time.strftime('%Y%m%d-%H%M%S')}")
    path = write_report(out_dir, result)
    for kind, stats in (("", result["phases"]), ("CPU ", result["cpu"])):
        for name, v in stats.items():
            print(f"{kind + name:<30} min {v['min']:6.2f} s   median {v['median']:6.2f} s")
    print(f"report: {path}")
    return result


if __name__ == "__main__":
    run_main(main)
