"""Vidur's measured operator profiles as a cost model (``clock.profile_dir=...``).

Vidur (github microsoft/vidur) profiles each operator of a transformer layer on real GPUs and
writes ``<root>/<gpu>/<org>/<model>/mlp.csv`` (per token count: the layer's GEMMs, norms, RoPE,
activation and residual add) and ``attention.csv`` (per (batch, context): decode attention; per
prompt length: prefill attention), times in ms, one row per measured shape, columns as Vidur
names them (``time_stats.<operator>.median`` plus the shape's columns). forge ships none of
that data: ``clock.profile_dir`` is either a directory holding the two files, or Vidur's
``data/profiling/compute`` root, resolved with ``clock.hardware`` and ``clock.model``.

A step is charged as Vidur's predictor charges it (without its CPU overheads, which Vidur skips by
default): per layer, the ``mlp.csv`` operators at the step's token count, decode attention at
(decodes, their mean context), prefill attention at one prompt of length sqrt(Σq²); each
attention times 1.1 when it batches more than one request (Vidur's batching overhead fractions);
times the number of layers; with ``clock.tensor_parallel`` > 1 the rows measured at that degree
and two all-reduces per layer from the preset's link (``conf/hardware``). Between measured points
values are interpolated linearly; beyond the last, scaled linearly (tokens, batch, context) or
quadratically (prompt length)."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forge.models.base import ModelDims
from forge.sim.operators import OperatorConstants, all_reduce_time
from forge.sim.step_sums import StepSums, SummedCostModel

MLP_OPERATORS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
OPTIONAL_MLP_OPERATORS = ("post_attention_layernorm",)
MLP_COLUMNS = (
    "n_head",
    "n_kv_head",
    "n_embd",
    "n_expanded_embd",
    "num_tokens",
    "num_tensor_parallel_workers",
    *(f"time_stats.{op}.median" for op in MLP_OPERATORS),
)
ATTENTION_COLUMNS = (
    "n_q_head",
    "n_kv_head",
    "n_embd",
    "num_tensor_parallel_workers",
    "batch_size",
    "kv_cache_size",
    "prefill_chunk_size",
    "time_stats.attn_prefill.median",
    "time_stats.attn_decode.median",
)
# clock.model presets -> the model directory Vidur profiles them under
VIDUR_MODEL_NAMES = {
    "llama-2-7b": "meta-llama/Llama-2-7b-hf",
    "llama-2-13b": "meta-llama/Llama-2-13b-hf",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
}
BATCHING_OVERHEAD = 0.1  # Vidur's attention_{prefill,decode}_batching_overhead_fraction defaults


def resolve_profile_dir(profile_dir: str, hardware: str, model: str) -> Path:
    """The directory holding ``mlp.csv`` and ``attention.csv`` (see the module docstring)."""
    root = Path(profile_dir)
    if not root.is_dir():
        raise ValueError(f"clock.profile_dir={profile_dir!r} is not a directory")
    if (root / "mlp.csv").is_file():
        return root
    gpus = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not (root / hardware).is_dir():
        raise ValueError(
            f"clock.profile_dir={profile_dir!r} has no mlp.csv and no profiles for clock.hardware={hardware!r} "
            f"(GPU directories there: {gpus})"
        )
    if model not in VIDUR_MODEL_NAMES:
        raise ValueError(
            f"clock.model={model!r} has no Vidur profile name (known: {sorted(VIDUR_MODEL_NAMES)}); "
            f"point clock.profile_dir at the directory holding its mlp.csv and attention.csv"
        )
    path = root / hardware / VIDUR_MODEL_NAMES[model]
    if not (path / "mlp.csv").is_file():
        raise ValueError(f"clock.profile_dir={profile_dir!r}: no profile for clock.model={model!r} at {path}")
    return path


def _read(path: Path, required: Sequence[str]) -> Any:
    import pandas as pd

    if not path.is_file():
        raise ValueError(f"clock.profile_dir: {path} not found (Vidur writes mlp.csv and attention.csv)")
    df = pd.read_csv(path)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise ValueError(f"clock.profile_dir: {path} lacks Vidur's columns {missing}")
    return df.drop_duplicates()


def check_profile_dir(profile_dir: str, hardware: str, model: str) -> Path:
    """Resolve the directory and check both files have Vidur's columns; a clear error otherwise."""
    path = resolve_profile_dir(profile_dir, hardware, model)
    _read(path / "mlp.csv", MLP_COLUMNS)
    _read(path / "attention.csv", ATTENTION_COLUMNS)
    return path


class Curve:
    """Piecewise-linear y(x) through measured points (duplicates averaged); beyond the last point
    y scales as (x / x_last) ** ``power``, below the first it is the first value."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], power: float = 1.0) -> None:
        acc: dict[float, list[float]] = {}
        for x, y in zip(xs, ys, strict=True):
            acc.setdefault(float(x), []).append(float(y))
        if not acc:
            raise ValueError("a profile curve needs at least one measured point")
        self.xs = sorted(acc)
        self.ys = [sum(acc[x]) / len(acc[x]) for x in self.xs]
        self.power = power

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * (x / xs[-1]) ** self.power
        i = bisect_right(xs, x)
        x0, x1 = xs[i - 1], xs[i]
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (x - x0) / (x1 - x0)


class Surface:
    """z(a, b) bilinear over measured points: a ``Curve`` in b per measured a, interpolated in a
    between the two nearest (scaled linearly beyond the largest a)."""

    def __init__(self, a: Sequence[float], b: Sequence[float], z: Sequence[float]) -> None:
        rows: dict[float, tuple[list[float], list[float]]] = {}
        for ai, bi, zi in zip(a, b, z, strict=True):
            bs, zs = rows.setdefault(float(ai), ([], []))
            bs.append(float(bi))
            zs.append(float(zi))
        if not rows:
            raise ValueError("a profile surface needs at least one measured point")
        self.a = sorted(rows)
        self.curves = [Curve(*rows[ai]) for ai in self.a]

    def __call__(self, a: float, b: float) -> float:
        xs = self.a
        if a <= xs[0]:
            return self.curves[0](b)
        if a >= xs[-1]:
            return self.curves[-1](b) * a / xs[-1]
        i = bisect_right(xs, a)
        z0, z1 = self.curves[i - 1](b), self.curves[i](b)
        return z0 + (z1 - z0) * (a - xs[i - 1]) / (xs[i] - xs[i - 1])


class VidurProfileCostModel(SummedCostModel):
    """Step times from Vidur's operator profiles (module docstring); seconds per layer from ms."""

    fast_paths = True  # its hooks keep the base class's fast-path promise (forge.core.fast_paths)

    def __init__(
        self,
        num_layers: int,
        layer_ops: Curve,
        decode_attention: Surface,
        prefill_attention: Curve,
        tensor_parallel: int = 1,
        hidden_bytes: float = 0.0,
        constants: OperatorConstants | None = None,
    ) -> None:
        self.num_layers = num_layers
        self.layer_ops, self.decode_attention, self.prefill_attention = layer_ops, decode_attention, prefill_attention
        self.tp, self.hidden_bytes, self.constants = tensor_parallel, hidden_bytes, constants

    @classmethod
    def load(
        cls, profile_dir: str, hardware: str, model: str, dims: ModelDims, tensor_parallel: int = 1
    ) -> VidurProfileCostModel:
        path = check_profile_dir(profile_dir, hardware, model)
        mlp = _read(path / "mlp.csv", MLP_COLUMNS)
        att = _read(path / "attention.csv", ATTENTION_COLUMNS)
        shape = f"n_embd={dims.hidden_size}, n_head={dims.num_heads}, n_kv_head={dims.num_kv_heads}"
        mlp = mlp[
            (mlp["n_embd"] == dims.hidden_size)
            & (mlp["n_head"] == dims.num_heads)
            & (mlp["n_kv_head"] == dims.num_kv_heads)
            & (mlp["n_expanded_embd"] == dims.intermediate_size)
            & (mlp["num_tensor_parallel_workers"] == tensor_parallel)
        ]
        att = att[
            (att["n_embd"] == dims.hidden_size)
            & (att["n_q_head"] == dims.num_heads)
            & (att["n_kv_head"] == dims.num_kv_heads)
            & (att["num_tensor_parallel_workers"] == tensor_parallel)
        ]
        for name, df in (("mlp.csv", mlp), ("attention.csv", att)):
            if len(df) == 0:
                raise ValueError(
                    f"clock.profile_dir: {path / name} has no rows for clock.model={model!r} ({shape}, "
                    f"intermediate {dims.intermediate_size}) at clock.tensor_parallel={tensor_parallel}"
                )
        if "block_size" in att.columns and (att["block_size"] == 16).any():
            att = att[att["block_size"] == 16]
        ops = [f"time_stats.{op}.median" for op in (*MLP_OPERATORS, *OPTIONAL_MLP_OPERATORS)]
        ops = [c for c in ops if c in mlp.columns]
        layer_ms = mlp[ops].fillna(0).sum(axis=1)
        decode = att[att["prefill_chunk_size"] == 0]
        prefill = att[(att["prefill_chunk_size"] > 0) & (att["kv_cache_size"] == 0)]
        if len(decode) == 0 or len(prefill) == 0:
            raise ValueError(
                f"clock.profile_dir: {path / 'attention.csv'} needs decode rows (prefill_chunk_size 0) and "
                f"prefill rows (kv_cache_size 0)"
            )
        ms = 1e-3
        return cls(
            dims.num_layers,
            Curve(mlp["num_tokens"].tolist(), (layer_ms * ms).tolist()),
            Surface(
                decode["batch_size"].tolist(),
                decode["kv_cache_size"].tolist(),
                (decode["time_stats.attn_decode.median"] * ms).tolist(),
            ),
            Curve(
                prefill["prefill_chunk_size"].tolist(),
                (prefill["time_stats.attn_prefill.median"] * ms).tolist(),
                power=2.0,
            ),
            tensor_parallel,
            dims.hidden_size * dims.bytes_per_param,
            OperatorConstants.load(hardware) if tensor_parallel > 1 else None,
        )

    def layer_time(self, s: StepSums) -> float:
        t = self.layer_ops(s.tokens)
        if s.num_decodes:
            t += self.decode_attention(s.num_decodes, s.decode_context / s.num_decodes) * (
                1 + BATCHING_OVERHEAD * (s.num_decodes > 1)
            )
        if s.num_prefills:
            t += self.prefill_attention(math.sqrt(s.prefill_query_sq)) * (1 + BATCHING_OVERHEAD * (s.num_prefills > 1))
        if self.constants is not None:
            c = self.constants
            t += 2 * all_reduce_time(s.tokens * self.hidden_bytes, self.tp, c.link_bw, c.link_latency_s)
        return t

    def time_of(self, sums: StepSums) -> float:
        return self.num_layers * self.layer_time(sums)
