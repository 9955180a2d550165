"""Sliding-window block freeing on and off: the KV memory one long request holds, and its greedy tokens.

``python -m experiments.window_memory [--model gemma3|tiny] [--context 2048] [--new-tokens 40] [--out DIR]``
runs one request of ``--context`` prompt tokens generating ``--new-tokens`` greedy tokens with
``kvcache.free_outside_window=false`` (every layer keeps its whole context) and ``true`` (the hybrid
allocator: windowed layers free the blocks before their window), and writes ``DIR/README.md`` (default
``reports/window_memory``) with the rows of ``window_rows`` (the function the ``kv_memory`` study can call)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from forge.config import compose_config
from forge.core.request import Request
from forge.core.sampling_params import SamplingParams
from forge.engine.build import build_engine
from forge.engine.runner import ModelRunner
from forge.models.base import Model

REPO = Path(__file__).resolve().parent.parent
MODELS = {
    "gemma3": ["model=gemma3", "model.max_position=4096", "engine.max_model_len=4096"],
    "tiny": ["model=tiny", "engine.max_model_len=4096"],  # no windows: both rows alike (a smoke test of the command)
}


def long_prompt(model: Model, num_tokens: int) -> list[int]:
    """``num_tokens`` tokens of a plain, varied English-like text (numbers in sentences)."""
    text = " ".join(f"Item {i} weighs {i * 7 % 13} kilograms and costs {i * 11 % 17} euros." for i in range(num_tokens))
    ids = model.tokenizer.encode(text)[:num_tokens]
    if len(ids) < num_tokens:
        raise ValueError(f"the text gives only {len(ids)} tokens")
    return ids


def window_rows(
    overrides: Sequence[str], context: int, new_tokens: int = 40, model: Model | None = None
) -> list[dict[str, Any]]:
    """One row per ``kvcache.free_outside_window`` (false, then true) for one greedy request of
    ``context`` prompt tokens and ``new_tokens`` new ones under ``overrides`` (``model`` reused when
    given): the pool's pages and bytes per page, the most pages (and MiB) the request held after a
    step and those it held after its last unfinished step, the longest request the pool could hold
    (``token_capacity``), its tokens and whether they equal the first row's."""
    rows: list[dict[str, Any]] = []
    for free in (False, True):
        cfg = compose_config([*overrides, f"kvcache.free_outside_window={str(free).lower()}"])
        engine = build_engine(cfg, model=model)
        model = engine.runner.model
        ids = long_prompt(model, context)
        params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        engine.add_request(Request("long", ids, params, arrival_time=0.0))
        kv = engine.scheduler.kv
        peak, held, tokens = 0, 0, []
        for _ in range(context + new_tokens + 1):  # at least one token per step
            for out in engine.step():
                tokens = list(out.token_ids)
            if not engine.has_unfinished():
                break
            held = kv.num_blocks - kv.num_free_blocks()  # after a step it did not finish in
            peak = max(peak, held)
        engine.check_idle()
        assert isinstance(engine.runner, ModelRunner)  # a real model's: KV tensors
        page_bytes = sum(t[0].numel() * t.element_size() for pair in engine.runner.kv_pages for t in pair)
        groups = kv.kv_groups
        rows.append(
            {
                "free_outside_window": free,
                "layout": "one table"
                if groups is None
                else f"{groups.num_groups} groups x {groups.layers_per_page} layers, windows {groups.windows}",
                "pool_pages": kv.num_blocks,
                "page_kib": page_bytes / 1024,
                "peak_pages_held": peak,
                "peak_kv_mib": peak * page_bytes / 2**20,
                "last_pages_held": held,
                "last_kv_mib": held * page_bytes / 2**20,
                "token_capacity": kv.token_capacity(cfg.engine.max_num_batched_tokens),
                "tokens": tokens,
            }
        )
    for row in rows:
        row["same_tokens_as_off"] = row["tokens"] == rows[0]["tokens"]
    return rows


def fmt_load(load: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.1f}" for x in load)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m experiments.window_memory", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(MODELS), default="gemma3")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--new-tokens", type=int, default=40)
    ap.add_argument("--out", default=str(REPO / "reports" / "window_memory"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    overrides = [*MODELS[args.model], "engine.max_num_batched_tokens=512", "kvcache.num_blocks=512"]
    rows = window_rows(overrides, args.context, args.new_tokens)
    from experiments.common import provenance

    prov = provenance()
    command = "python -m experiments.window_memory " + " ".join(argv if argv is not None else sys.argv[1:])
    cols = ["free_outside_window", "layout", "pool_pages", "page_kib", "peak_pages_held", "peak_kv_mib"]
    cols += ["last_pages_held", "last_kv_mib", "token_capacity", "same_tokens_as_off"]
    lines = [
        "# Sliding-window block freeing: KV held by one long request",
        "",
        f"One greedy request of {args.context} prompt tokens and {args.new_tokens} new tokens, "
        f"`{' '.join(overrides)}`, with `kvcache.free_outside_window` false and true (one run each: pages "
        "are counts, not timings). `peak`: the most pages held after a step (during the prefill's 512-token "
        "chunks), `last`: after the last step before it finished (decoding); `token_capacity`: the longest "
        "request this pool could hold (`KVCacheManager.token_capacity`, chunks of 512).",
        "",
        f"- command: `{command}`",
        f"- commit: `{prov['commit']}`",
        f"- machine: {prov['machine']}; generated {prov['date']}",
        f"- load average (1, 5, 15 min) before / after: {fmt_load(load_before)} / {fmt_load(os.getloadavg())}",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    for r in rows:
        cells = [f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Greedy tokens (off): `{rows[0]['tokens']}`", ""]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
