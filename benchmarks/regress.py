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

The gate ratchets: a benchmark *faster* than its baseline by more than the threshold fails it too
("baseline stale: re-save"), as does a benchmark only one side has, so a speed-up cannot leave a
baseline behind that a later slowdown hides under. Re-save the baseline (on a quiet machine) in the
commit that changes the speed. The baseline records what it was measured on: the CPU model, cores,
Python, the load average at the end of the run, and the commit (with whether the tree had
uncommitted changes), all taken from the pytest-benchmark JSON of the run itself.

``--from-json FILE`` compares (or saves) a JSON that ``pytest benchmarks/suites`` already wrote with
the gate's flags (``PYTEST_ARGS`` plus ``--benchmark-json=FILE``) instead of running the suites.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
STALE = "baseline stale: re-save"
RESAVE = "forge bench regress --save"


def run_suites() -> dict[str, Any]:
    """The pytest-benchmark JSON of one run of the suites with the gate's flags."""
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
        data: dict[str, Any] = json.loads(data_path.read_text())
    return data


def minimums(data: dict[str, Any]) -> dict[str, float]:
    """Each benchmark's minimum CPU seconds per round; refuses a JSON timed otherwise than the gate times."""
    out = {}
    for bench in data.get("benchmarks", []):
        options = bench.get("options", {})
        if options.get("timer") != "process_time" or options.get("disable_gc") is not True:
            raise SystemExit(
                f"{bench.get('name')} was not timed as the gate times (timer {options.get('timer')!r}, "
                f"disable_gc {options.get('disable_gc')!r}): measure with {' '.join(PYTEST_ARGS[:3])}"
            )
        out[str(bench["name"])] = float(bench["stats"]["min"])
    return out


def normalise(minimums: dict[str, float]) -> dict[str, float]:
    """Every benchmark's minimum in calibration loops (the calibration itself left out)."""
    if CALIBRATION not in minimums:
        raise SystemExit(f"the suites have no {CALIBRATION} benchmark to normalise by")
    unit = minimums[CALIBRATION]
    return {name: value / unit for name, value in sorted(minimums.items()) if name != CALIBRATION}


@dataclass
class Verdict:
    """The gate's table, and which benchmarks slowed past the threshold or left the baseline stale."""

    lines: list[str] = field(default_factory=list)
    slower: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


def compare(now: dict[str, float], base: dict[str, float], threshold: float) -> Verdict:
    """A table line per benchmark: REGRESSION above ``1 + threshold`` times the baseline, STALE below
    ``1 - threshold`` times it or on one side only (the baseline no longer describes the suites)."""
    verdict = Verdict()
    for name in sorted(set(now) | set(base)):
        if name not in now or name not in base:
            verdict.stale.append(name)
            where = "only in " + ("the baseline" if name in base else "this run")
            verdict.lines.append(f"{name:<44} {where:>28}  STALE")
            continue
        ratio = now[name] / base[name]
        mark = "ok"
        if ratio > 1 + threshold:
            mark = "REGRESSION"
            verdict.slower.append(name)
        elif ratio < 1 - threshold:
            mark = "STALE"
            verdict.stale.append(name)
        verdict.lines.append(f"{name:<44} {base[name]:>9.3f} {now[name]:>9.3f} {ratio - 1:>+8.1%}  {mark}")
    return verdict


def provenance(data: dict[str, Any]) -> dict[str, Any]:
    """The machine and commit a benchmark JSON was measured on (pytest-benchmark's ``machine_info`` and
    ``commit_info``, with the load average ``benchmarks/suites/conftest.py`` adds)."""
    info = data.get("machine_info", {})
    cpu = info.get("cpu", {})
    commit = data.get("commit_info", {})
    load = info.get("load_average")
    return {
        "commit": str(commit.get("id") or "unknown")[:7],
        "commit_dirty": bool(commit.get("dirty", False)),
        "measured_at": data.get("datetime"),
        "machine": {
            "cpu_model": cpu.get("brand_raw") or info.get("processor") or info.get("machine") or "?",
            "cores": cpu.get("count"),
            "python": info.get("python_version"),
            "load_average_1m_5m_15m": load,
        },
    }


def describe(record: dict[str, Any]) -> str:
    """One line naming a baseline's commit and machine (a baseline written before these were fields
    holds the machine as a string)."""
    m = record.get("machine", "?")
    if isinstance(m, dict):
        load = m.get("load_average_1m_5m_15m") or ["?"]
        m = f"{m.get('cpu_model')}, {m.get('cores')} cores, Python {m.get('python')}, load average {load[0]}"
    dirty = " (with uncommitted changes)" if record.get("commit_dirty") else ""
    return f"commit {record.get('commit', '?')}{dirty} on {m}"


def save(data: dict[str, Any], path: Path) -> None:
    raw = minimums(data)
    record: dict[str, Any] = {
        "unit": "minimum CPU time per round / minimum of test_calibration_loop in the same run",
        **provenance(data),
        "calibration_seconds": raw.get(CALIBRATION),
        "benchmarks": normalise(raw),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"baseline written: {path} ({describe(record)})")


def gate(data: dict[str, Any], path: Path, threshold: float) -> int:
    """Print the comparison with the baseline at ``path``; 1 on a regression or a stale baseline."""
    if not path.exists():
        raise SystemExit(f"no baseline at {path}: run {RESAVE} first")
    base = json.loads(path.read_text())
    verdict = compare(normalise(minimums(data)), base["benchmarks"], threshold)
    print(f"baseline: {describe(base)}\nthis run: {describe(provenance(data))}")
    print(f"{'benchmark (calibration loops)':<44} {'baseline':>9} {'now':>9} {'change':>8}")
    print("\n".join(verdict.lines))
    if verdict.slower:
        print(
            f"FAIL: {len(verdict.slower)} benchmark(s) slower by more than {threshold:.0%}: {', '.join(verdict.slower)}"
        )
    if verdict.stale:
        print(
            f"FAIL: {STALE} ({RESAVE}, on a quiet machine, in the commit that changed the speed): "
            f"{len(verdict.stale)} benchmark(s) faster by more than {threshold:.0%} or not in both: "
            f"{', '.join(verdict.stale)}"
        )
    if verdict.slower or verdict.stale:
        return 1
    print(f"PASS: every benchmark within {threshold:.0%} of the baseline")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--save", action="store_true", help="write the baseline instead of comparing")
    p.add_argument("--baseline", type=Path, default=BASELINE)
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD, help="allowed change (0.1 = 10%%)")
    p.add_argument("--from-json", type=Path, help="a pytest-benchmark JSON of the suites instead of a run")
    args = p.parse_args(argv)
    if not 0 < args.threshold < 1:
        raise SystemExit("--threshold must be > 0 and < 1")
    data = json.loads(args.from_json.read_text()) if args.from_json else run_suites()
    if args.save:
        save(data, args.baseline)
        return 0
    return gate(data, args.baseline, args.threshold)


if __name__ == "__main__":
    sys.exit(main())
