"""What ``forge bench serve`` writes: requests.parquet, summary.json and report.md (+ the latency
plots), to ``--output-dir`` or ``outputs/bench/serve-<date>-<time>``; the ``--api-key`` value is
written as ``***`` wherever the command line is recorded."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.machine import cpu_model

API_KEY_FLAG = "--api-key"
REDACTED = "***"


def default_output_dir() -> Path:
    """``outputs/bench/serve-<date>-<time>`` below the current directory (git-ignored, as runs' ``outputs/``)."""
    return Path("outputs") / "bench" / f"serve-{time.strftime('%Y%m%d-%H%M%S')}"


def redacted(argv: Sequence[str]) -> list[str]:
    """``argv`` with the value of ``--api-key`` (``--api-key KEY`` or ``--api-key=KEY``) replaced by
    ``***``, for what is written to summary.json and report.md."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i > 0 and argv[i - 1] == API_KEY_FLAG:
            out.append(REDACTED)
        elif arg.startswith(API_KEY_FLAG + "="):
            out.append(f"{API_KEY_FLAG}={REDACTED}")
        else:
            out.append(arg)
    return out


def machine_name() -> str:
    """``lscpu``'s model name and the core count (as reports cite the machine)."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def git_commit() -> str:
    """The checkout's short commit, "with uncommitted work" when its tree is dirty."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"
    return commit + (" with uncommitted work" if dirty else "")


def write_outputs(
    output_dir: str | None, frame: pd.DataFrame, summary: dict[str, Any], model: str, argv: Sequence[str]
) -> Path:
    """Write the run's files (the command line ``argv`` redacted) and return their directory."""
    out_dir = Path(output_dir) if output_dir else default_output_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out_dir / "requests.parquet")
    meta = {"argv": redacted(argv), "model": model, "commit": git_commit(), "machine": machine_name()}
    (out_dir / "summary.json").write_text(json.dumps({**summary, **meta}, indent=2))
    write_report(out_dir, frame, summary, meta)
    return out_dir


def write_report(out_dir: Path, frame: pd.DataFrame, summary: dict[str, Any], meta: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = frame[frame["success"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ttft = np.sort(ok["ttft"].to_numpy() * 1e3)
    axes[0].plot(ttft, np.arange(1, len(ttft) + 1) / max(len(ttft), 1))
    axes[0].set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="TTFT CDF")
    itl = np.asarray([x for lst in ok["itl"] for x in lst]) * 1e3
    axes[1].hist(itl, bins=50)
    axes[1].set(xlabel="ITL (ms)", ylabel="count", title="inter-token latency")
    axes[2].scatter(ok["send_time"], ok["e2el"] * 1e3, s=6)
    axes[2].set(xlabel="send time (s)", ylabel="E2EL (ms)", title="E2E latency over the run")
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=110)
    plt.close(fig)
    lines = ["# Serving benchmark", "", "```", " ".join(meta["argv"]), "```", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items() if k != "argv"]
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in summary.items()]
    lines += ["", "![latency](latency.png)", ""]
    (out_dir / "report.md").write_text("\n".join(lines))
