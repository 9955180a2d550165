"""A Vidur ``attention.csv`` computed from forge's own A100 cost model, for a labelled cross-check.

``python -m benchmarks.vidur_attention_profile --out PATH`` writes, in the exact schema of Vidur's
measured A100 / Llama-2-7B ``attention.csv`` (same columns, same order, times in ms per layer), the
attention times that forge's ``clock.cost=operators`` model charges on ``clock.hardware=a100`` for
Llama-2-7B (``OperatorCostModel``, ``conf/hardware/a100.yaml``). Vidur's measured profile is a Git
LFS object this sandbox cannot fetch (``docs/fidelity.md``); run with this file instead, Vidur
charges attention as forge does, so forge ÷ Vidur then measures everything else: the cluster layer,
the per-replica scheduler and batching, and forge's dense layer against Vidur's measured ``mlp.csv``.
It is **not** Vidur's profile and must never be mistaken for it: ``benchmarks/vidur_setup.sh
--computed-attention`` installs it under that label, with its sha256.

Rows, as Vidur's profiler writes them (``vidur/profiling/attention``):

- decode (``prefill_chunk_size`` 0, ``is_prefill`` False): ``batch_size`` requests, each with
  ``kv_cache_size`` cached tokens and one new one, so the new token attends to ``kv_cache_size`` + 1
  keys: forge's ``decode_attention_time(batch_size, kv_cache_size + 1)``; ``attn_prefill`` empty;
- prefill (``batch_size`` 1, ``is_prefill`` True): one chunk of ``prefill_chunk_size`` tokens after
  ``kv_cache_size`` cached ones: forge's per-layer time of that step minus its dense part (GEMMs and
  small operators), i.e. causal pairs at ``prefill_attn_flops_efficiency`` plus cached pairs at
  ``prefill_cached_attn_flops_efficiency``; ``attn_decode`` empty.

``attn_input_reshape`` and ``attn_output_reshape`` are 0 (forge charges no such operator, and
Vidur's predictor trains no model on them); min = max = mean = median, std 0 (computed, not
measured); ``attention_backend`` is ``forge_operators_a100`` so the file names its origin.

The grid is what Vidur's predictor needs for the runs of ``experiments/vidur_reference.py`` (it
predicts decode at every batch 1-128 and every 64th context, prefill at kv_cache_size step 64 and
chunk² of the prompts' sqrt(Σq²)): decode rows at every batch 1-128 and every 64th context to 1,024
(every 256th to 4,096); prefill rows at every 16th chunk to 4,096 (and 1, 2, 4, 8) with nothing
cached, and every 64th chunk after every 256th cached count. Deterministic: the same forge gives
the same bytes."""

from __future__ import annotations

import argparse
import csv
from collections.abc import Iterator
from pathlib import Path

from benchmarks.digest import sha256_of
from forge.models.presets import model_dims
from forge.sim.cost_model import BatchShape
from forge.sim.operators import OperatorConstants, OperatorCostModel
from forge.sim.step_sums import StepSums

OPERATORS = ("attn_input_reshape", "attn_decode", "attn_output_reshape", "attn_prefill")
STATS = ("min", "max", "mean", "median", "std")
SHAPE_COLUMNS = (
    "n_embd",
    "n_q_head",
    "n_kv_head",
    "block_size",
    "num_tensor_parallel_workers",
    "max_model_len",
    "batch_size",
    "prefill_chunk_size",
    "kv_cache_size",
    "is_prefill",
    "attention_backend",
)
COLUMNS = (*(f"time_stats.{op}.{s}" for op in OPERATORS for s in STATS), *SHAPE_COLUMNS)
BACKEND = "forge_operators_a100"
MODEL, HARDWARE, BLOCK_SIZE, MAX_MODEL_LEN = "llama-2-7b", "a100", 16, 4096


def forge_cost_model(hardware: str = HARDWARE, model: str = MODEL) -> OperatorCostModel:
    """forge's ``clock.cost=operators`` model for ``model`` on ``hardware``, one GPU."""
    return OperatorCostModel(model_dims(model), OperatorConstants.load(hardware))


def decode_ms(cost: OperatorCostModel, batch_size: int, kv_cache_size: int) -> float:
    """One layer's decode attention, ms: each request attends to its cached tokens and its new one."""
    return cost.decode_attention_time(batch_size, kv_cache_size + 1) * 1e3


def prefill_ms(cost: OperatorCostModel, chunk: int, kv_cache_size: int) -> float:
    """One layer's attention for one chunk after ``kv_cache_size`` cached tokens, ms: the layer's
    time for that step less its dense part (GEMMs, small operators: the same for any context)."""
    sums = StepSums.of_batch(BatchShape(query_lens=[chunk], seq_lens=[kv_cache_size + chunk], num_sampled=1))
    return (cost.layer_time(sums) - cost.terms(chunk).dense) * 1e3


def decode_grid(max_batch: int = 128, max_len: int = MAX_MODEL_LEN) -> Iterator[tuple[int, int]]:
    """(batch_size, kv_cache_size) of the decode rows."""
    contexts = [*range(64, 1024 + 1, 64), *range(1024 + 256, max_len + 1, 256)]
    for kv in contexts:
        for batch in range(1, max_batch + 1):
            yield batch, kv


def prefill_grid(max_len: int = MAX_MODEL_LEN) -> Iterator[tuple[int, int]]:
    """(prefill_chunk_size, kv_cache_size) of the prefill rows (chunk + cached ≤ ``max_len``)."""
    for chunk in (1, 2, 4, 8, *range(16, max_len + 1, 16)):
        yield chunk, 0
    for kv in range(256, max_len, 256):
        for chunk in range(64, max_len - kv + 1, 64):
            yield chunk, kv


def row(times: dict[str, float | None], batch: int, chunk: int, kv: int) -> dict[str, object]:
    dims = model_dims(MODEL)
    out: dict[str, object] = {}
    for op in OPERATORS:
        t = times.get(op, 0.0)
        for s in STATS:
            out[f"time_stats.{op}.{s}"] = "" if t is None else (0.0 if s == "std" else t)
    shape = (dims.hidden_size, dims.num_heads, dims.num_kv_heads, BLOCK_SIZE, 1, MAX_MODEL_LEN, batch, chunk, kv)
    out |= dict(zip(SHAPE_COLUMNS, shape, strict=False))
    return out | {"is_prefill": chunk > 0, "attention_backend": BACKEND}


def rows(cost: OperatorCostModel) -> Iterator[dict[str, object]]:
    """Every row of the profile: decodes first (by context, then batch), then prefills."""
    for batch, kv in decode_grid():
        yield row({"attn_decode": decode_ms(cost, batch, kv), "attn_prefill": None}, batch, 0, kv)
    for chunk, kv in prefill_grid():
        yield row({"attn_decode": None, "attn_prefill": prefill_ms(cost, chunk, kv)}, 1, chunk, kv)


def write(path: Path, cost: OperatorCostModel | None = None) -> str:
    """Write the profile to ``path``; its sha256."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows(cost or forge_cost_model()))
    return sha256_of(path)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.vidur_attention_profile", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--out", type=Path, required=True, help="where to write the attention.csv")
    args = ap.parse_args(argv)
    digest = write(args.out)
    print(f"{args.out}: forge-computed attention profile (not Vidur's measured one), sha256 {digest}")


if __name__ == "__main__":
    main()
