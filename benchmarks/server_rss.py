"""A served request's memory: the server's RSS before, at its peak during, and after a completions request
of a given shape (prompts x n x logprobs x max_tokens), run ``--repeat`` times on one server process.

    python -m benchmarks.server_rss --prompts 16 --n 16 --logprobs 20 --max-tokens 186 --repeat 3
    python -m benchmarks.server_rss --embed-inputs 256     # /v1/embeddings: 256 x "a b", float encoding

The server is ``run.py mode=serve`` in a child process (``--set`` adds overrides; the default model is
``synthetic``); its RSS is sampled every 10 ms with psutil while the request runs. Prints one JSON line per
run (output units as ``server.max_output_units`` counts them, response bytes, seconds, RSS in MiB)."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psutil

from benchmarks.child_server import child_server

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


@contextmanager
def server(overrides: list[str]) -> Iterator[tuple[psutil.Process, int]]:
    """A ``run.py mode=serve`` child on a free port: its process and the port."""
    cmd = [sys.executable, "run.py", "mode=serve", "server.port=0", "hydra.run.dir=/tmp/forge-server-rss", *overrides]
    with child_server(cmd) as (proc, port):
        yield psutil.Process(proc.pid), port


def peak_rss(proc: psutil.Process, stop: threading.Event, out: list[int]) -> None:
    while not stop.is_set():
        out.append(proc.memory_info().rss)
        time.sleep(0.01)


def run_once(proc: psutil.Process, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    before = proc.memory_info().rss
    samples: list[int] = [before]
    stop = threading.Event()
    sampler = threading.Thread(target=peak_rss, args=(proc, stop, samples))
    sampler.start()
    t0 = time.monotonic()
    r = httpx.post(url + path, json=body, timeout=3600)
    seconds = time.monotonic() - t0
    stop.set()
    sampler.join()
    after = proc.memory_info().rss
    return {
        "status": r.status_code,
        "response_bytes": len(r.content),
        "seconds": round(seconds, 2),
        "rss_before_mib": round(before / MIB, 1),
        "rss_peak_mib": round(max(samples) / MIB, 1),
        "rss_after_mib": round(after / MIB, 1),
        "peak_growth_mib": round((max(samples) - before) / MIB, 1),
        "kept_mib": round((after - before) / MIB, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--logprobs", type=int, default=20)
    ap.add_argument("--max-tokens", type=int, default=186)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--embed-inputs", type=int, default=0, help="measure /v1/embeddings of this many inputs instead")
    ap.add_argument("--set", nargs="*", default=["model=synthetic"], help="run.py overrides for the server")
    args = ap.parse_args()
    model = next((s.split("=", 1)[1] for s in args.set if s.startswith("model=")), "synthetic")
    if args.embed_inputs:
        path, body = (
            "/v1/embeddings",
            {"model": model, "input": ["a b"] * args.embed_inputs, "encoding_format": "float"},
        )
        warm: dict[str, Any] = {**body, "input": ["warm up"]}
        units = 0  # inputs x dimensions, read from the warm-up's embedding below
    else:
        prompts = [f"prompt {i}: tell me a long story" for i in range(args.prompts)]
        body = {"model": model, "prompt": prompts, "n": args.n, "logprobs": args.logprobs}
        body = {**body, "max_tokens": args.max_tokens, "ignore_eos": True}
        path, warm = "/v1/completions", {**body, "prompt": "warm up", "n": 1, "max_tokens": 4}
        units = args.prompts * args.n * args.max_tokens * (1 + args.logprobs + 1)
    with server(args.set) as (proc, port):
        url = f"http://127.0.0.1:{port}"
        answer = httpx.post(url + path, json=warm, timeout=600).raise_for_status().json()
        units = units or args.embed_inputs * len(answer["data"][0]["embedding"])
        for i in range(args.repeat):
            print(json.dumps({"run": i, "output_units": units, **run_once(proc, url, path, body)}), flush=True)


if __name__ == "__main__":
    main()
