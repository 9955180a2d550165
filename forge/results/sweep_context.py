"""What a sweep report says around its numbers: the title naming the model, clock and workload;
how the jobs ran (``launch.json``) checked against when each run says it ran (its ``timing.json``);
and every warning the runs wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from forge.results.launch_record import read_launch_record
from forge.results.run_label import run_label

TITLE_GROUPS = ("model", "clock", "workload")


def _group_part(labels: list[str], group: str) -> str | None:
    parts = {p for label in labels for p in label.split(" · ") if p.startswith(f"{group}=")}
    if len(parts) <= 1:
        return next(iter(parts), None)
    names = sorted({p.split(" (", 1)[0] for p in parts})
    details = [set(p.partition(" (")[2].rstrip(")").split(", ")) for p in parts]
    common = [d for d in sorted(set.intersection(*details)) if d]
    return f"{' / '.join(names)} ({', '.join([*common, 'the rest varies across runs'])})"


def _wall_detail(df: pd.DataFrame) -> str:
    machines = sorted({str(m) for m in df.get("machine", pd.Series(dtype=str)).dropna()})
    threads = sorted({int(t) for t in df.get("torch_threads", pd.Series(dtype=float)).dropna()})
    bits = [f"on {', '.join(machines)}"] if machines else []
    if threads:
        bits.append(f"{'/'.join(map(str, threads))} torch thread{'s' if threads != [1] else ''}")
    return " ".join(bits)


def sweep_title(sweep_dir: Path, df: pd.DataFrame) -> str:
    """``model=tiny · clock=wall (on HOST x86_64, 1 torch thread) · workload=poisson (32 requests, 4 req/s)``:
    the groups of ``TITLE_GROUPS`` as the runs' labels name them (a group whose details differ
    across runs says so), a wall clock with the machine and torch threads, and the seeds."""
    labels = [run_label(sweep_dir / str(r)) for r in df["run"]]
    parts = []
    for group in TITLE_GROUPS:
        part = _group_part(labels, group)
        if part is None:
            continue
        if group == "clock" and "clock=wall" in part and "clock" in df and (df["clock"] == "wall").any():
            part += f" ({_wall_detail(df)})"
        parts.append(part)
    return " · ".join(parts) or "sweep"


def read_timings(sweep_dir: Path, df: pd.DataFrame) -> pd.DataFrame:
    """``run``, ``clock``, ``started_at``, ``ended_at`` from each run's ``timing.json`` (runs without one
    are left out)."""
    rows = []
    for run, clock in zip(df["run"], df.get("clock", pd.Series(["?"] * len(df))), strict=True):
        path = sweep_dir / str(run) / "timing.json"
        if path.is_file():
            t = json.loads(path.read_text())
            rows.append({"run": run, "clock": clock, "started_at": t["started_at"], "ended_at": t["ended_at"]})
    return pd.DataFrame(rows, columns=["run", "clock", "started_at", "ended_at"])


def overlapping_with_wall(timings: pd.DataFrame) -> list[tuple[str, str]]:
    """Pairs of runs that ran at the same time, one of them on the wall clock."""
    rows = [
        (str(r["run"]), str(r["clock"]), float(r["started_at"]), float(r["ended_at"]))
        for r in timings.to_dict("records")
    ]
    return [
        (a[0], b[0])
        for i, a in enumerate(rows)
        for b in rows[i + 1 :]
        if "wall" in (a[1], b[1]) and a[2] < b[3] and b[2] < a[3]
    ]


def max_concurrent(timings: pd.DataFrame) -> int:
    """The most runs that were running at one moment."""
    events = sorted([(t, 1) for t in timings["started_at"]] + [(t, -1) for t in timings["ended_at"]])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return peak


def launch_lines(sweep_dir: Path, df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The report's "how the jobs ran" paragraph, and the sweep-level warnings it implies."""
    record = read_launch_record(sweep_dir)
    timings = read_timings(sweep_dir, df)
    lines: list[str] = []
    warnings: list[str] = []
    if record is None:
        lines.append(
            "How the jobs ran was not recorded (no `launch.json`: a launcher other than forge's local or Ray one)."
        )
    else:
        n_wall = sum(j.clock == "wall" for j in record.jobs)
        alone = [j for j in record.jobs if j.ran == "alone"]
        together = [j for j in record.jobs if j.ran == "parallel"]
        lines.append(f"Launcher `{record.launcher}`, `wall_jobs: {record.wall_jobs}`; pinning to cores: not offered.")
        if together:
            lines.append(f"- {len(together)} jobs ran {record.parallel}.")
        if alone:
            lines.append(f"- {len(alone)} wall-clock jobs ran {record.serial}.")
        if record.wall_jobs == "parallel" and n_wall:
            warnings.append(
                f"{n_wall} wall-clock jobs ran in parallel (hydra.launcher.wall_jobs=parallel): "
                "their timings include contention with each other"
            )
    lines += _timing_lines(timings, warnings)
    return lines, warnings


def _timing_lines(timings: pd.DataFrame, warnings: list[str]) -> list[str]:
    if timings.empty:
        return ["- No run recorded when it ran (no `timing.json`)."]
    pairs = overlapping_with_wall(timings)
    most = max_concurrent(timings)
    lines = [f"- From the runs' `timing.json`: at most {most} run{'s' if most != 1 else ''} running at once"]
    if (timings["clock"] == "wall").any():
        lines[0] += "; no wall-clock run overlapped another run" if not pairs else f"; {len(pairs)} overlaps"
    lines[0] += "."
    if pairs:
        shown = ", ".join(f"{a} & {b}" for a, b in pairs[:8])
        warnings.append(f"wall-clock runs overlapped other runs in time ({shown}): their timings contend")
    return lines


def run_warnings(sweep_dir: Path, df: pd.DataFrame) -> list[tuple[str, str, str]]:
    """``(run, overrides, warning)`` for every warning in the runs' ``summary.json``."""
    out = []
    for run, overrides in zip(df["run"], df["overrides"], strict=True):
        summary: dict[str, Any] = json.loads((sweep_dir / str(run) / "summary.json").read_text())
        out += [(str(run), str(overrides), str(w)) for w in summary.get("warnings", [])]
    return out
