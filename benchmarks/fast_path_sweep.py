"""A randomized check of two promises: the same config and seed give the same results, and
``engine.fast_paths=false`` (the plain step loop) gives what the fast paths give (forge/core/fast_paths.py).

    python -m benchmarks.fast_path_sweep --configs 20 --seed 1

Each config (``benchmarks.fast_path_draw``: random overrides of ``python run.py model=synthetic
clock=simulated``) runs in fresh ``run.py`` processes with fast paths and with ``engine.fast_paths=false``;
their ``requests.parquet``, ``steps.parquet`` and ``summary.json`` (less ``commit`` and ``machine``) must be
equal. Every ``--rerun-every``-th config, and any that differs, runs again with fast paths (a rerun must
be equal too). Outside ``cluster=disaggregated`` and ``model.timing_only=true`` (whose token ids are not
the model's) the tokens of every request are compared as well, fast vs plain, run in this process.
A config forge refuses with a one-line config error is skipped; a mismatch, a crash (any other exit) or
a run past ``--timeout`` seconds is a finding, printed as one JSON line with its overrides (``--log``
keeps every config's line). The exit status is 1 when there is a finding.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.fast_path_draw import Draw, draw

ROOT = Path(__file__).resolve().parent.parent
BASE = ["model=synthetic", "clock=simulated", "progress=false", "report=false"]
IGNORED_SUMMARY = ("commit", "machine")
HUNG = -1000  # ``Run.rc`` of a run stopped at its timeout
FINDINGS = ("mismatch", "crash", "hang")


@dataclass(frozen=True)
class Run:
    rc: int
    err: str
    cpu_s: float
    out: Path


def run_py(overrides: list[str], out: Path, timeout: float) -> Run:
    """One fresh ``run.py`` process writing to ``out``; its CPU-seconds (user + sys)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "run.py", *BASE, *overrides, f"hydra.run.dir={out}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        child = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Run(HUNG, f"no result after {timeout} s", timeout, out)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return Run(child.returncode, child.stderr.decode(errors="replace"), round(cpu, 2), out)


def first_difference(a: Any, b: Any) -> str:
    """Where two data frames first differ: the column and the row."""
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return f"shapes/columns differ: {a.shape} {list(a.columns)} vs {b.shape} {list(b.columns)}"
    for col in a.columns:
        if not a[col].equals(b[col]):
            for i in range(len(a)):
                x, y = (_plain(f[col].iloc[i]) for f in (a, b))
                if x != y and not (x != x and y != y):  # (NaN == NaN here)
                    return f"column {col} row {i}: {x!r} vs {y!r}"
            return f"column {col}: dtypes {a[col].dtype} vs {b[col].dtype}"
    return "frames differ (index)"


def _plain(value: Any) -> Any:
    """A cell as a Python value (numpy scalars and arrays as floats and lists)."""
    return value.tolist() if hasattr(value, "tolist") else value


def compare_runs(a: Path, b: Path) -> list[str]:
    """The differences between two run directories' results (empty: equal)."""
    import pandas as pd

    problems = []
    for name in ("requests.parquet", "steps.parquet"):
        fa, fb = pd.read_parquet(a / name), pd.read_parquet(b / name)
        if not fa.equals(fb):
            problems.append(f"{name}: {first_difference(fa, fb)}")
    sa, sb = (json.loads((p / "summary.json").read_text()) for p in (a, b))
    for key in sorted(set(sa) | set(sb)):
        x, y = sa.get(key), sb.get(key)
        if key not in IGNORED_SUMMARY and x != y and not (x != x and y != y):  # (NaN == NaN here)
            problems.append(f"summary.json {key}: {x!r} vs {y!r}")
    return problems


def finals(overrides: list[str], fast: bool) -> dict[str, tuple[Any, ...]]:
    """Each request's tokens, finish reason and cached tokens, run in this process (one pool of replicas)."""
    from forge.cluster.build import build_pool, build_router, cluster_spec
    from forge.config import compose_config, validate
    from forge.engine.build import workload_requests

    cfg = compose_config([*BASE, *overrides, f"engine.fast_paths={str(fast).lower()}"])
    validate(cfg)
    pool = build_pool(cfg, cluster_spec(cfg).pools()[0], build_router(cfg))
    try:
        out = pool.run(workload_requests(cfg, pool.replicas[0].engine), keep=True)
    finally:
        for replica in pool.replicas:
            replica.engine.close()
    return {k: (tuple(v.token_ids), v.finish_reason, v.num_cached_tokens) for k, v in out.items()}


def compare_tokens(overrides: list[str]) -> list[str]:
    on, off = finals(overrides, True), finals(overrides, False)
    for key in sorted(set(on) | set(off)):
        if on.get(key) != off.get(key):
            return [f"tokens of {key}: {on.get(key)} vs {off.get(key)}"]
    return []


def compare(first: Run, other: Run, name: str) -> list[str]:
    if other.rc != 0:
        return [f"{name}: exit {other.rc}: {other.err[-2000:]}"]
    return [f"{name}: {p}" for p in compare_runs(first.out, other.out)]


def failed(run: Run) -> dict[str, Any]:
    """A first run that did not finish: refused (a one-line config error), a crash or a hang."""
    last = (run.err.strip().splitlines() or [""])[-1]
    if run.rc == HUNG:
        return {"status": "hang", "error": run.err}
    if run.rc == 2 and last.startswith("config error"):
        return {"status": "refused", "error": last}
    return {"status": "crash", "error": run.err[-3000:]}


def check(d: Draw, work: Path, rerun: bool, timeout: float) -> dict[str, Any]:
    """Run one config with fast paths, without, and (``rerun``, or on a difference) with them again; compare."""
    shutil.rmtree(work, ignore_errors=True)
    fast = run_py(d.overrides, work / "fast", timeout)
    result: dict[str, Any] = {"overrides": d.overrides, "cpu_s": fast.cpu_s}
    if fast.rc != 0:
        return {**result, **failed(fast)}
    problems = compare(fast, run_py([*d.overrides, "engine.fast_paths=false"], work / "plain", timeout), "plain")
    if problems or rerun:  # (the two ran in processes of different hash seeds already)
        problems += compare(fast, run_py(d.overrides, work / "rerun", timeout), "rerun")
    if not d.disaggregated and not d.timing_only and not problems:
        try:
            problems += compare_tokens(d.overrides)
        except Exception as e:  # a crash of the in-process run is a finding, reported with its config
            problems.append(f"tokens: {type(e).__name__}: {e}")
    return {**result, "status": "mismatch" if problems else "ok", "problems": problems}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--configs", type=int, default=20, help="configs to draw")
    parser.add_argument("--seed", type=int, default=0, help="the draw's seed: the same seed, the same configs")
    parser.add_argument("--rerun-every", type=int, default=4, help="rerun with fast paths every Nth config")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a run may take (then: a hang)")
    parser.add_argument("--minutes", type=float, default=None, help="stop drawing after this many minutes")
    parser.add_argument("--set", nargs="*", default=[], help="overrides added to every config (last wins)")
    parser.add_argument("--log", type=Path, default=None, help="append one JSON line per config here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    stop = time.time() + 60 * args.minutes if args.minutes is not None else None
    work = Path(tempfile.mkdtemp(prefix="fast_path_sweep_"))
    counts: dict[str, int] = {}
    try:
        for i in range(args.configs):
            if stop is not None and time.time() > stop:
                break
            d = draw(rng)
            d.add(*args.set)
            result = {"i": i, "seed": args.seed, **check(d, work, i % args.rerun_every == 0, args.timeout)}
            counts[result["status"]] = counts.get(result["status"], 0) + 1
            line = json.dumps(result)
            if args.log is not None:
                with args.log.open("a") as f:
                    f.write(line + "\n")
            print(line if result["status"] in FINDINGS else f"{i} {result['status']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(counts))
    return 1 if any(counts.get(k) for k in FINDINGS) else 0


if __name__ == "__main__":
    sys.exit(main())
