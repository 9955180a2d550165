"""A regression gate for the pytest-benchmark suites that holds on a shared 2-core machine.

    forge bench regress                 compare this checkout with the committed baseline (exit 1 on a regression)
    forge bench regress --save          measure and write the baseline
    python -m benchmarks.regress [--threshold 0.1] [--baseline PATH] [--save]

What makes it stable where ``--benchmark-compare-fail=mean:25%`` is not: each benchmark is timed in
process CPU time (``--benchmark-timer=time.process_time``: time other processes take from the core
does not count), with the GC off, and summarised by its minimum over its rounds (noise only ever
adds time); every minimum is divided by the minimum of a fixed calibration loop measured in the same
run (``benchmarks/suites/test_bench_calibration.py``), so what is compared is "cost in calibration
loops", which a slower or busier machine changes far less than seconds. A benchmark fails when its
normalised minimum exceeds the baseline's by more than ``--threshold`` (default 10%: a real slowdown
of 20% or more is caught with room for the noise left).
"""

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

ROOT = Path(__file__).resolve().parent.parent
SUITES = ROOT / "benchmarks" / "suites"
BASELINE = SUITES / "baselines" / "baseline.json"
CALIBRATION = "test_calibration_loop"
DEFAULT_THRESHOLD = 0.10
PYTEST_ARGS = [
    "--benchmark-enable",
    "--benchmark-timer=time.process_time",
    "--benchmark-disable-gc",
    "-q",
    "-p",
    "no:cacheprovider",
]


def measure() -> dict[str, float]:
    """Each benchmark's minimum CPU seconds per round, from one run of the suites."""
    with tempfile.TemporaryDirectory() as tmp:
        data_path = Path(tmp) / "bench.json"
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(SUITES), *PYTEST_ARGS, f"--benchmark-json={data_path}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise SystemExit(f"the benchmark suites failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        data = json.loads(data_path.read_text())
    return {b["name"]: float(b["stats"]["min"]) for b in data["benchmarks"]}


def normalise(minimums: dict[str, float]) -> dict[str, float]:
    """Every benchmark's minimum in calibration loops (the calibration itself left out)."""
    if CALIBRATION not in minimums:
        raise SystemExit(f"the suites have no {CALIBRATION} benchmark to normalise by")
    unit = minimums[CALIBRATION]
    return {name: value / unit for name, value in sorted(minimums.items()) if name != CALIBRATION}


def compare(now: dict[str, float], base: dict[str, float], threshold: float) -> tuple[list[str], list[str]]:
    """A table line per benchmark and the names of those slower than ``base`` by more than ``threshold``
    (a benchmark missing from either side is reported, not failed)."""
    lines, failed = [], []
    for name in sorted(set(now) | set(base)):
        if name not in now or name not in base:
            lines.append(f"{name:<44} {'only in ' + ('the baseline' if name in base else 'this run'):>24}")
            continue
        ratio = now[name] / base[name]
        verdict = "REGRESSION" if ratio > 1 + threshold else "ok"
        if verdict != "ok":
            failed.append(name)
        lines.append(f"{name:<44} {base[name]:>9.3f} {now[name]:>9.3f} {ratio - 1:>+8.1%}  {verdict}")
    return lines, failed


def git_commit() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        return rev.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def machine() -> str:
    cpu = cpu_model(platform.processor() or platform.machine())
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--save", action="store_true", help="write the baseline instead of comparing")
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="allowed slowdown (0.1 = 10%%)")
    args = p.parse_args(argv)
    if args.threshold <= 0:
        raise SystemExit("--threshold must be > 0")
    load = os.getloadavg()[0]
    raw = measure()
    now = normalise(raw)
    if args.save:
        args.baseline.parent.mkdir(parents=True, exist_ok=True)
        record: dict[str, Any] = {
            "unit": "minimum CPU time per round / minimum of test_calibration_loop in the same run",
            "commit": git_commit(),
            "machine": machine(),
            "load_average_1m_at_start": round(load, 2),
            "calibration_seconds": raw[CALIBRATION],
            "benchmarks": now,
        }
        args.baseline.write_text(json.dumps(record, indent=2) + "\n")
        print(f"baseline written: {args.baseline}")
        return 0
    if not args.baseline.exists():
        raise SystemExit(f"no baseline at {args.baseline}: run forge bench regress --save first")
    base = json.loads(args.baseline.read_text())
    lines, failed = compare(now, base["benchmarks"], args.threshold)
    print(f"baseline: commit {base['commit']} on {base['machine']}; this run: load average {load:.2f}")
    print(f"{'benchmark (calibration loops)':<44} {'baseline':>9} {'now':>9} {'change':>8}")
    print("\n".join(lines))
    if failed:
        print(f"FAIL: {len(failed)} benchmark(s) slower by more than {args.threshold:.0%}: {', '.join(failed)}")
        return 1
    print(f"PASS: no benchmark slower by more than {args.threshold:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
