"""The Vidur profile adapter (clock.profile_dir): Vidur's mlp.csv / attention.csv layout, written
here in miniature (forge ships no Vidur data), interpolated; bad input named at compose time."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from forge.config import ConfigError, compose_config
from forge.engine.build import build_engine
from forge.models.presets import model_dims
from forge.sim.clock import SimulatedClock
from forge.sim.cost_model import BatchShape
from forge.sim.vidur_profile import MLP_OPERATORS, VidurProfileCostModel

LLAMA = model_dims("llama-2-7b")
SHAPE = {"n_head": 32, "n_kv_head": 32, "n_embd": 4096, "n_expanded_embd": 11008, "vocab_size": 32768}


def stats(op: str, ms: float) -> dict[str, float]:
    """Vidur's five columns per operator (min, max, mean, median, std), in ms."""
    return {
        f"time_stats.{op}.{k}": v
        for k, v in zip(("min", "max", "mean", "median", "std"), (ms, ms, ms, ms, 0.0), strict=True)
    }


def write_profile(directory: Path, tp: int = 1, drop: str | None = None) -> Path:
    """Each mlp.csv operator takes ``0.01 ms + 0.001 ms x tokens`` (8 operators); decode attention
    ``0.001 ms x batch x context / 64``; prefill attention ``1e-5 ms x length^2``."""
    directory.mkdir(parents=True, exist_ok=True)
    mlp = []
    for n in (1, 64, 512, 4096):
        row: dict[str, float] = {}
        for op in MLP_OPERATORS:
            row.update(stats(op, 0.01 + 0.001 * n))
        mlp.append({**row, **SHAPE, "use_gated_mlp": True, "num_tokens": n, "num_tensor_parallel_workers": tp})
    att = []
    base = {"n_embd": 4096, "n_q_head": 32, "n_kv_head": 32, "block_size": 16, "num_tensor_parallel_workers": tp}
    for b in (1, 32, 128):
        for ctx in (64, 1024, 4096):
            att.append(
                {
                    **base,
                    **stats("attn_decode", 0.001 * b * ctx / 64),
                    **stats("attn_prefill", 0.0),
                    "batch_size": b,
                    "kv_cache_size": ctx,
                    "prefill_chunk_size": 0,
                    "is_decode": True,
                }
            )
    for q in (64, 512, 2048):
        att.append(
            {
                **base,
                **stats("attn_decode", 0.0),
                **stats("attn_prefill", 1e-5 * q * q),
                "batch_size": 1,
                "kv_cache_size": 0,
                "prefill_chunk_size": q,
                "is_decode": False,
            }
        )
    frames = {"mlp.csv": pd.DataFrame(mlp), "attention.csv": pd.DataFrame(att)}
    for name, df in frames.items():
        if drop is not None and drop in df.columns:
            df = df.drop(columns=[drop])
        df.to_csv(directory / name, index=False)
    return directory


def test_layer_times_are_interpolated_between_measured_points(tmp_path: Path) -> None:
    m = VidurProfileCostModel.load(str(write_profile(tmp_path)), "a100", "llama-2-7b", LLAMA)
    ms, layers, ops = 1e-3, 32, len(MLP_OPERATORS)
    # 300 tokens of prefill: ops linear in tokens (exact between 64 and 512), attention at 300^2 on the
    # quadratic points (interpolated between 64 and 512)
    attn = 1e-5 * (64**2 + (512**2 - 64**2) * (300 - 64) / (512 - 64))
    expected = layers * (ops * (0.01 + 0.001 * 300) + attn) * ms
    assert m.step_time(BatchShape([300], [300], 1)) == pytest.approx(expected)
    # 32 decodes at a mean context of 1024: a measured point, times Vidur's 10% batching overhead
    expected = layers * (ops * (0.01 + 0.001 * 32) + 1.1 * 0.001 * 32 * 1024 / 64) * ms
    assert m.step_time(BatchShape([1] * 32, [1024] * 32, 32)) == pytest.approx(expected)
    # two prompts are looked up as one of length sqrt(200^2 + 200^2), with the 10% overhead
    q = (2 * 200**2) ** 0.5
    attn = 1.1 * 1e-5 * (64**2 + (512**2 - 64**2) * (q - 64) / (512 - 64))
    expected = layers * (ops * (0.01 + 0.001 * 400) + attn) * ms
    assert m.step_time(BatchShape([200, 200], [200, 200], 2)) == pytest.approx(expected)


def test_vidur_directory_layout_is_resolved_by_gpu_and_model(tmp_path: Path) -> None:
    write_profile(tmp_path / "a100" / "meta-llama" / "Llama-2-7b-hf")
    clock = SimulatedClock("a100", "llama-2-7b", profile_dir=str(tmp_path))
    clock.bind(LLAMA)
    assert isinstance(clock.cost_model, VidurProfileCostModel)
    assert clock.cost_model.step_time(BatchShape([1], [64], 1)) > 0


def test_tensor_parallel_rows_and_all_reduce(tmp_path: Path) -> None:
    one = VidurProfileCostModel.load(str(write_profile(tmp_path / "tp1")), "a100", "llama-2-7b", LLAMA)
    two = VidurProfileCostModel.load(str(write_profile(tmp_path / "tp2", tp=2)), "a100", "llama-2-7b", LLAMA, 2)
    shape = BatchShape([512], [512], 1)
    assert two.step_time(shape) > one.step_time(shape)  # same per-GPU rows here, plus the all-reduces
    with pytest.raises(ValueError, match=r"clock\.tensor_parallel=2"):
        VidurProfileCostModel.load(str(tmp_path / "tp1"), "a100", "llama-2-7b", LLAMA, 2)


@pytest.mark.parametrize(
    ("layout", "overrides", "message"),
    [
        ("flat", [], None),
        ("flat-missing-column", [], r"lacks Vidur's columns \['time_stats\.mlp_up_proj\.median'\]"),
        ("vidur", ["clock.hardware=h100"], r"clock\.hardware='h100'"),
        ("vidur", ["clock.model=mistral-7b"], r"clock\.model='mistral-7b'"),
        ("flat", ["clock.tensor_parallel=-2"], r"clock\.tensor_parallel"),
        ("nowhere", [], r"clock\.profile_dir=.* is not a directory"),
    ],
)
def test_bad_profiles_are_named_at_compose_time(
    tmp_path: Path, layout: str, overrides: list[str], message: str | None
) -> None:
    if layout == "flat":
        write_profile(tmp_path)
    elif layout == "flat-missing-column":
        write_profile(tmp_path, drop="time_stats.mlp_up_proj.median")
    elif layout == "vidur":
        write_profile(tmp_path / "a100" / "meta-llama" / "Llama-2-7b-hf")
    root = tmp_path / "absent" if layout == "nowhere" else tmp_path
    overrides = [
        "model=synthetic",
        "clock=simulated",
        "clock.hardware=a100",
        "clock.model=llama-2-7b",
        f"clock.profile_dir={root}",
        *overrides,
    ]
    if message is None:
        cfg = compose_config(overrides)
        assert isinstance(build_engine(cfg).clock.cost_model, VidurProfileCostModel)  # type: ignore[attr-defined]
    else:
        with pytest.raises(ConfigError, match=message):
            compose_config(overrides)
