"""A ``vllm bench serve``-style client: send a forge workload to an OpenAI-compatible server
and report TTFT, TPOT, ITL, E2EL (mean, median, std, p90, p99), throughput and goodput, with the
server's own mean TTFT from its ``/metrics`` over the run beside the client's (what the client adds).

    python -m benchmarks.serve --url http://127.0.0.1:8000 --workload poisson \\
        --num-prompts 200 --request-rate 20 --burstiness 1.0 --max-concurrency 64 \\
        --goodput ttft:500 tpot:50 e2el:5000

Prompts and output lengths come from the forge workload option (``conf/workload/<name>.yaml``,
plus ``--set key=value`` overrides); arrivals from ``--request-rate`` (Poisson, or gamma with
``--burstiness``; ``inf`` = all at once), or the workload's own arrival times if no rate is given.
Each request streams ``/v1/completions`` with the prompt's token ids, ``max_tokens`` = the drawn
output length and ``ignore_eos``. Writes requests.parquet, summary.json and report.md (+ plots) to
``--output-dir`` (default ``outputs/bench/serve-<date>-<time>``, git-ignored; the committed
``reports/serve/`` only when named); the ``--api-key`` value is written as ``***``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import numpy as np
import pandas as pd
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from benchmarks.serve_report import write_outputs
from benchmarks.sse_client import HTTPStatusError, SSEClient
from forge.cli import compose_errors_as_config_errors, hydra_error_line
from forge.config import ConfigError, compose_group
from forge.core.errors import ENVIRONMENT_EXIT_CODE as ENV
from forge.core.errors import CommandError, run_main
from forge.engine.gc_pause import no_collection_at_exit, rare_gc
from forge.tokenizers.base import Tokenizer
from forge.workloads.synthetic import Workload


class RemoteTokenizer(Tokenizer):
    """The server's vocabulary, as far as a workload needs it; text goes through /tokenize."""

    def __init__(self, url: str, card: dict[str, Any], headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.vocab_size = int(card.get("vocab_size") or 32000)
        self.eos_token_ids = frozenset(int(t) for t in card.get("eos_token_ids", []))
        self.bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        body = {"prompt": text, "add_special_tokens": add_special_tokens}
        r = httpx.post(self.url + "/tokenize", json=body, headers=self.headers)
        r.raise_for_status()
        return list(r.json()["tokens"])

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        r = httpx.post(self.url + "/detokenize", json={"tokens": list(ids)}, headers=self.headers)
        r.raise_for_status()
        return str(r.json()["prompt"])


@dataclass
class Result:
    request_id: str
    prompt_len: int
    output_len: int
    send_time: float = 0.0
    ttft: float | None = None
    e2el: float | None = None
    itl: list[float] = field(default_factory=list)
    num_output_tokens: int = 0
    success: bool = False
    error: str = ""

    @property
    def tpot(self) -> float | None:
        if self.ttft is None or self.e2el is None or self.num_output_tokens < 2:
            return None
        return (self.e2el - self.ttft) / (self.num_output_tokens - 1)


def arrival_gaps(n: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """vLLM's: gamma inter-arrivals with shape ``burstiness`` and mean ``1/rate`` (0 if rate is inf)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    return list(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n))


async def send_one(client: SSEClient, model: str, prompt: list[int], res: Result, t0: float) -> None:
    body = json.dumps(
        {
            "model": model,
            "prompt": prompt,
            "max_tokens": res.output_len,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    start = time.perf_counter()
    res.send_time = start - t0
    last = start
    try:
        async for data in client.stream("/v1/completions", body):
            if data == b"[DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(data)
            if "error" in chunk:
                res.error = str(chunk["error"])[:300]
                return
            if chunk.get("choices"):  # a token chunk (the usage chunk has none)
                if res.ttft is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
            if chunk.get("usage"):
                res.num_output_tokens = int(chunk["usage"]["completion_tokens"])
        res.e2el = time.perf_counter() - start
        res.success = res.ttft is not None
    except (OSError, ValueError, HTTPStatusError, asyncio.IncompleteReadError) as exc:
        res.error = f"{type(exc).__name__}: {exc}"


async def run_benchmark(
    url: str,
    model: str,
    prompts: list[list[int]],
    results: list[Result],
    offsets: list[float],
    max_concurrency: int | None,
    headers: dict[str, str],
) -> float:
    limit = max_concurrency or len(prompts)
    sem = asyncio.Semaphore(limit)
    client = SSEClient(url, headers)
    t0 = time.perf_counter()

    async def scheduled(i: int) -> None:
        await asyncio.sleep(max(0.0, offsets[i] - (time.perf_counter() - t0)))
        async with sem:
            await send_one(client, model, prompts[i], results[i], t0)

    await asyncio.gather(*(scheduled(i) for i in range(len(prompts))))
    return time.perf_counter() - t0


TTFT_METRIC = "time_to_first_token_seconds"


def server_ttft_totals(url: str, headers: dict[str, str]) -> tuple[float, float] | None:
    """The server's own TTFT histogram from ``/metrics`` (forge's ``forge:`` or vLLM's ``vllm:``
    names): its sum of seconds and its count over all models, or None if it has none."""
    try:
        r = httpx.get(url + "/metrics", headers=headers)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    totals = {"sum": 0.0, "count": 0.0}
    found = False
    for line in r.text.splitlines():
        name, _, value = line.partition(" ")
        for prefix in ("forge:", "vllm:"):
            for kind in totals:
                if name.startswith(f"{prefix}{TTFT_METRIC}_{kind}"):
                    totals[kind] += float(value.split()[0])
                    found = True
    return (totals["sum"], totals["count"]) if found else None


def server_view(
    before: tuple[float, float] | None, after: tuple[float, float] | None, client_mean_ms: float
) -> dict[str, float]:
    """The server's mean TTFT over the run (its /metrics before and after) next to the client's:
    the difference is what the network and the client itself add."""
    if after is None:
        return {}
    before = before or (0.0, 0.0)  # a labelled series appears with its first observation
    if after[1] <= before[1]:
        return {}
    server_ms = (after[0] - before[0]) / (after[1] - before[1]) * 1e3
    return {"server_mean_ttft_ms": server_ms, "client_minus_server_ttft_ms": client_mean_ms - server_ms}


def build_workload(overrides: list[str]) -> Workload:
    """The workload option with ``--set``'s overrides; one it cannot build is a one-line ``ConfigError``."""
    try:
        with compose_errors_as_config_errors():
            workload: Workload = instantiate(compose_group(overrides, "workload"))
            return workload
    except InstantiationException as exc:
        raise ConfigError(hydra_error_line(exc)) from None


def parse_goodput(items: list[str]) -> dict[str, float]:
    slos = {}
    for item in items:
        name, _, ms = item.partition(":")
        if name not in ("ttft", "tpot", "e2el") or not ms:
            raise SystemExit(f"--goodput takes ttft:MS tpot:MS e2el:MS, got {item!r}")
        slos[name] = float(ms)
    return slos


def summarize(results: list[Result], duration: float, slos: dict[str, float]) -> dict[str, Any]:
    ok = [r for r in results if r.success]
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": sum(r.prompt_len for r in ok),
        "total_output_tokens": sum(r.num_output_tokens for r in ok),
        "request_throughput": len(ok) / duration,
        "output_throughput": sum(r.num_output_tokens for r in ok) / duration,
        "total_token_throughput": sum(r.prompt_len + r.num_output_tokens for r in ok) / duration,
    }
    series = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [x for r in ok for x in r.itl],
        "e2el": [r.e2el for r in ok if r.e2el is not None],
    }
    for key, values in series.items():
        arr = np.asarray(values, dtype=float) * 1e3
        for stat, fn in (("mean", np.mean), ("median", np.median), ("std", np.std)):
            out[f"{stat}_{key}_ms"] = float(fn(arr)) if arr.size else float("nan")
        for p in (90, 99):
            out[f"p{p}_{key}_ms"] = float(np.percentile(arr, p)) if arr.size else float("nan")
    if slos:
        good = 0
        for r in ok:
            vals = {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.e2el}
            if all(vals[k] is None or vals[k] * 1e3 <= ms for k, ms in slos.items()):  # type: ignore[operator]
                good += 1
        out["goodput_slos_ms"] = slos
        out["request_goodput"] = good / duration
    return out


def model_cards(url: str, headers: dict[str, str]) -> list[dict[str, Any]]:
    """The server's ``/v1/models`` cards; a server that cannot be reached, refuses the key or does not
    answer as an OpenAI-compatible one is a one-line ``CommandError`` (exit 3)."""
    try:
        r = httpx.get(url + "/v1/models", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise CommandError(f"forge bench serve: cannot reach {url} ({type(exc).__name__}: {exc})", ENV) from None
    if r.status_code in (401, 403):
        why = "the --api-key given is not one it accepts" if headers else "it needs an API key: give --api-key KEY"
        raise CommandError(f"forge bench serve: {url} refused /v1/models with {r.status_code} ({why})", ENV)
    try:
        cards = list(r.json()["data"]) if r.status_code == 200 else []
    except (ValueError, KeyError, TypeError):
        cards = []
    if not cards:
        raise CommandError(f"forge bench serve: {url}/v1/models answered {r.status_code} without a model list", ENV)
    return cards


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import sys

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="default: the server's first model")
    p.add_argument("--workload", default="poisson", help="a conf/workload option")
    p.add_argument("--set", nargs="*", default=[], help="config overrides, e.g. workload.input_len.high=128")
    p.add_argument("--num-prompts", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=None, help="req/s (inf: all at once)")
    p.add_argument("--burstiness", type=float, default=1.0)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--goodput", nargs="*", default=[], help="SLOs: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key", default=None, help="sent as a Bearer token; written nowhere (*** in the report)")
    p.add_argument("--output-dir", default=None, help="default: outputs/bench/serve-<date>-<time> in this directory")
    args = p.parse_args(argv)
    if args.burstiness <= 0:
        raise SystemExit("--burstiness must be > 0")
    slos = parse_goodput(args.goodput)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    url = args.url.rstrip("/")
    cards = model_cards(url, headers)
    card = next((c for c in cards if c["id"] == args.model), cards[0]) if args.model else cards[0]
    overrides = [f"workload={args.workload}", f"seed={args.seed}", *args.set]
    if args.num_prompts:
        overrides.append(f"workload.num_requests={args.num_prompts}")
    workload = build_workload(overrides)
    specs = workload.requests(RemoteTokenizer(url, card, headers))
    max_len = int(card.get("max_model_len") or 1 << 30)
    prompts = [s.prompt_token_ids[: max_len - 1] for s in specs]
    results = [
        Result(s.request_id, len(pr), max(1, min(s.output_len, max_len - len(pr))))
        for s, pr in zip(specs, prompts, strict=True)
    ]
    if args.request_rate is not None:
        offsets = list(np.cumsum(arrival_gaps(len(specs), args.request_rate, args.burstiness, args.seed)))
    else:
        offsets = [s.arrival_time for s in specs]
    random.seed(args.seed)
    before = server_ttft_totals(url, headers)
    duration = asyncio.run(run_benchmark(url, card["id"], prompts, results, offsets, args.max_concurrency, headers))
    summary = summarize(results, duration, slos)
    summary.update(server_view(before, server_ttft_totals(url, headers), summary["mean_ttft_ms"]))
    frame = pd.DataFrame([{**asdict(r), "tpot": r.tpot} for r in results])
    args_given = ["python -m benchmarks.serve", *sys.argv[1:]] if argv is None else ["benchmarks.serve", *argv]
    out_dir = write_outputs(args.output_dir, frame, summary, card["id"], args_given)
    width = max(len(k) for k in summary)
    for k, v in summary.items():
        print(f"{k:<{width}}  {v:.3f}" if isinstance(v, float) else f"{k:<{width}}  {v}")
    print(f"results: {out_dir}")
    return summary


if __name__ == "__main__":
    no_collection_at_exit()  # as forge bench serve runs it (forge.cli.main)
    with rare_gc():
        run_main(main)
