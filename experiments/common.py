"""Shared study machinery: run a grid of configs (in parallel worker processes), gather them with
``forge.results.sweep.gather``, and write a report whose header says the command, commit and machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from forge.results.sweep import gather

REPO = Path(__file__).resolve().parent.parent

# Vidur's SLO as forge.results.sweep applies it (defaults --ttft-slo 2.0 --tbt-slo 0.2), in ms for the tables
TTFT_SLO_MS, TBT_SLO_MS = 2000.0, 200.0
SLO_HLINES = {"p90_ttft_ms": (TTFT_SLO_MS, "SLO"), "p99_itl_ms": (TBT_SLO_MS, "SLO")}  # for experiments.plots.lines
GOODPUT_NOTE = (
    "Goodput = requests/s with TTFT <= 2 s and their own P99 TBT <= 200 ms; `slo_met` = Vidur's aggregate SLO "
    "(P90 TTFT < 2 s and P99 TBT < 200 ms over the run)."
)


def run_one(overrides: list[str], run_dir: str) -> str:
    import torch

    from forge.config import compose_config
    from forge.main import run_offline

    torch.set_num_threads(1)  # 2 shared cores: OpenMP threads contend badly (see reports/README.md)
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    (path / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    run_offline(compose_config([*overrides, "progress=false", "report=false"]), path)
    return run_dir


def run_grid(name: str, base: Sequence[str], points: Sequence[Sequence[str]], n_jobs: int = 2) -> pd.DataFrame:
    """Each point's overrides (after ``base``) run once into ``outputs/studies/<name>/<i>``."""
    out = REPO / "outputs" / "studies" / name
    if out.exists():
        import shutil

        shutil.rmtree(out)
    jobs = [([*base, *p], str(out / f"{i:03d}")) for i, p in enumerate(points)]
    t0 = time.perf_counter()
    try:
        from joblib import Parallel, delayed

        Parallel(n_jobs=n_jobs, backend="loky")(delayed(run_one)(o, d) for o, d in jobs)
    except ImportError:
        for o, d in jobs:
            run_one(o, d)
    print(f"{name}: {len(jobs)} runs in {time.perf_counter() - t0:.0f} s")
    df = gather(out)
    df["run_dir"] = [str(out / r) for r in df["run"]]
    return df


# a request's schedule: equal in two runs iff they admitted, computed and finished every request at the same times
SCHEDULE_COLUMNS = ["request_id", "first_scheduled_time", "first_token_time", "finish_time", "num_preemptions"]


def same_schedule(run_a: str, run_b: str) -> bool:
    """Whether two runs (``run_grid``'s ``run_dir``) scheduled every request identically, bit for bit."""
    a, b = (
        pd.read_parquet(Path(r) / "requests.parquet", columns=SCHEDULE_COLUMNS).sort_values("request_id")
        for r in (run_a, run_b)
    )
    return a.reset_index(drop=True).equals(b.reset_index(drop=True))


def same_as(name: str, base: Sequence[str], points: dict[str, list[str]], reference: str) -> dict[str, bool]:
    """Run each named point once (after ``base``); for each one but ``reference``, whether it scheduled every
    request exactly as ``reference`` did."""
    df = run_grid(name, base, list(points.values()))
    dirs = dict(zip(points, sorted(df["run_dir"]), strict=True))  # run_grid numbers runs in order: 000, 001, ...
    return {k: same_schedule(dirs[reference], d) for k, d in dirs.items() if k != reference}


def provenance() -> dict[str, str]:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=REPO).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"

    # reports/ holds what the studies write (this run's own output included), so it does not make the tree dirty
    status = git("status", "--porcelain", "--untracked-files=all").splitlines()
    dirty = [ln.split(None, 1)[-1] for ln in status if ln.strip()]  # "XY path" (the first line's X may be stripped)
    dirty = [d for d in dirty if not d.startswith("reports/")]
    commit = git("rev-parse", "--short", "HEAD")
    if dirty and all(d.startswith("experiments/") for d in dirty):
        commit += " + experiments fix (uncommitted changes in experiments/: " + ", ".join(sorted(dirty)) + ")"
    elif dirty:
        commit += " with uncommitted work"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        cpu = next(ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name"))
    except (OSError, subprocess.CalledProcessError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return {
        "command": "python -m experiments.run " + " ".join(sys.argv[1:]),
        "commit": commit,
        "machine": f"{cpu}, {os.cpu_count()} cores (torch threads per run: 1{pinning()})",
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }


def pinning() -> str:
    """What the machine line adds when this process may run on fewer CPUs than the machine has (taskset)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if not allowed or len(allowed) >= (os.cpu_count() or 1):
        return ""
    return f"; pinned to CPU {', '.join(map(str, allowed))} (taskset), other jobs free to use the rest"


def header(title: str, intro: str, prov: dict[str, str], table: str = "results.csv") -> list[str]:
    """A report's title, introduction and provenance lines; ``table``: the CSV its figures are in."""
    return [
        f"# {title}",
        "",
        intro,
        "",
        f"- command: `{prov['command']}`",
        f"- commit: `{prov['commit']}`",
        f"- machine: {prov['machine']}; generated {prov['date']}",
        f"- every figure below is generated by that command (results table: `{table}`)",
        "",
    ]


def write_results(out: Path, df: pd.DataFrame, cols: Sequence[str] | None = None) -> None:
    """Create the report directory ``out`` and write ``df[cols]`` (all columns by default) to ``results.csv``."""
    out.mkdir(parents=True, exist_ok=True)
    (df if cols is None else df[list(cols)]).to_csv(out / "results.csv", index=False)


def section(title: str, body: Sequence[str]) -> list[str]:
    """Markdown lines of a ``## title`` section: heading, blank line, ``body``, blank line."""
    return [f"## {title}", "", *body, ""]


def write_readme(out: Path, title: str, intro: str, body: Sequence[str]) -> None:
    """``out/README.md``: the provenance header (see ``header``) followed by the ``body`` lines."""
    md = [*header(title, intro, provenance()), *body]
    (out / "README.md").write_text("\n".join(md))


def interpretation_and_results(sentences: Sequence[str], results: str) -> list[str]:
    """The closing sections the studies share: a bulleted ``Interpretation`` and a ``Results`` table."""
    return [*section("Interpretation", [f"- {s}" for s in sentences]), *section("Results", [results])]


def table(df: pd.DataFrame, cols: Sequence[str], fmt: dict[str, str] | None = None) -> str:
    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v: Any = r[c]
            if c in fmt and isinstance(v, int | float):
                cells.append(format(v, fmt[c]))
            else:
                cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def available_policies(wanted: Sequence[str]) -> list[str]:
    """The wanted scheduler options that exist in conf/scheduler/ (others are being written)."""
    return [p for p in wanted if (REPO / "conf" / "scheduler" / f"{p}.yaml").is_file()]


def policies_note(policies: Sequence[str], wanted: Sequence[str]) -> str:
    """``Policies: a, b`` for a report's intro, naming the ``wanted`` ones missing from conf/scheduler/."""
    missing = sorted(set(wanted) - set(policies))
    return f"Policies: {', '.join(policies)}" + (
        f" (not yet in conf/scheduler/: {', '.join(missing)})" if missing else ""
    )
