"""How much a running /v1/batches job slows interactive requests, by ``server.batch_max_in_flight``.

    python -m benchmarks.batch_interference [--repeats 3] [--out reports/serve/batch_interference.md]

A tiny-model server (``scheduler=fcfs``, ``engine.max_num_seqs=8``) runs a batch of 48 requests of
48 tokens while a client sends interactive completions of 16 tokens one after another until the
batch has completed (8 when there is no batch); each run reports the median latency of those
requests (wall seconds, client side), how many there were, and the batch's wall time. Runs: no
batch, the batch capped at 4 requests in flight (the default), and capped at 64 (no cap in effect).
The table holds the median over ``--repeats`` runs, with the machine, the commit and the load
average."""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.machine import cpu_model
from forge.config import compose_config
from forge.server.app import app_from_config
from forge.server.background import BackgroundServer

BATCH_LINES, BATCH_TOKENS, INTERACTIVE, INTERACTIVE_TOKENS, MAX_INTERACTIVE = 48, 48, 8, 16, 500
CAPS: tuple[int | None, ...] = (None, 4, 64)


def batch_file() -> bytes:
    body = {"model": "tiny", "max_tokens": BATCH_TOKENS, "ignore_eos": True, "temperature": 0}
    lines = [
        json.dumps(
            {"custom_id": f"b{i}", "method": "POST", "url": "/v1/completions", "body": {**body, "prompt": f"b{i}"}}
        )
        for i in range(BATCH_LINES)
    ]
    return "\n".join(lines).encode()


def one_run(cap: int | None, state_dir: str) -> tuple[float, int, float | None]:
    """(median interactive latency, interactive requests, batch wall time or None) for one server."""
    overrides = ["model=tiny", "scheduler=fcfs", "engine.max_num_seqs=8", f"server.state_dir={state_dir}"]
    if cap is not None:
        overrides.append(f"server.batch_max_in_flight={cap}")
    app, _ = app_from_config(compose_config(overrides), "tiny")
    with BackgroundServer(app) as s, httpx.Client(base_url=s.url, timeout=120) as c:
        started = time.perf_counter()
        batch_id = None
        if cap is not None:
            upload = c.post(
                "/v1/files", files={"file": ("b.jsonl", io.BytesIO(batch_file()))}, data={"purpose": "batch"}
            )
            create = {"input_file_id": upload.json()["id"], "endpoint": "/v1/completions", "completion_window": "24h"}
            batch_id = c.post("/v1/batches", json=create).json()["id"]
            while c.get(f"/v1/batches/{batch_id}").json()["status"] != "in_progress":
                time.sleep(0.01)
        latencies = []
        body = {"model": "tiny", "prompt": "interactive", "max_tokens": INTERACTIVE_TOKENS, "ignore_eos": True}
        # one after another: the 8 of a run without a batch; with one, every request started before it completed
        for i in range(MAX_INTERACTIVE):
            if batch_id is None and i == INTERACTIVE:
                break
            if batch_id is not None and c.get(f"/v1/batches/{batch_id}").json()["status"] == "completed":
                break
            t0 = time.perf_counter()
            assert c.post("/v1/completions", json=body).status_code == 200
            latencies.append(time.perf_counter() - t0)
        batch_s = None
        if batch_id is not None:
            deadline = time.monotonic() + 600
            while c.get(f"/v1/batches/{batch_id}").json()["status"] != "completed":
                assert time.monotonic() < deadline, "the batch did not complete"
                time.sleep(0.02)
            batch_s = time.perf_counter() - started
        return statistics.median(latencies), len(latencies), batch_s


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("reports/serve/batch_interference.md"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for cap in CAPS:
        runs = []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory() as state_dir:
                runs.append(one_run(cap, state_dir))
        lat = statistics.median(r[0] for r in runs)
        batch = [r[2] for r in runs if r[2] is not None]
        per_run = [f"{r[0]:.3f} s over {r[1]}" for r in runs]
        rows.append((cap, lat, statistics.median(batch) if batch else None, per_run))
        print(f"cap={cap}: interactive median {lat:.3f} s, runs {per_run}", flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Interactive latency while a batch runs (`server.batch_max_in_flight`)",
        "",
        f"`python -m benchmarks.batch_interference --repeats {args.repeats}` at commit {commit}, {cpu_model()} "
        f"(2 cores, shared), load average {load_before[0]:.1f} before / {os.getloadavg()[0]:.1f} after.",
        f"tiny model, scheduler=fcfs, engine.max_num_seqs=8; batch: {BATCH_LINES} requests x {BATCH_TOKENS} "
        f"tokens; interactive: sequential requests x {INTERACTIVE_TOKENS} tokens until the batch completed "
        f"({INTERACTIVE} without a batch). Wall seconds, median of {args.repeats} runs (each run's value: the "
        "median latency of its interactive requests; per run: that median over how many requests).",
        "",
        "| batch running | interactive latency (s) | batch wall time (s) | per run |",
        "|---|---|---|---|",
    ]
    for cap, lat, batch_s, per_run in rows:
        label = "no batch" if cap is None else f"batch_max_in_flight={cap}"
        shown = "-" if batch_s is None else f"{batch_s:.2f}"
        lines.append(f"| {label} | {lat:.3f} | {shown} | {'; '.join(per_run)} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
