"""benchmarks/vidur_attention_profile.py: Vidur's attention.csv schema filled from forge's A100 operator
cost model; benchmarks/vidur_setup.sh installs it only as what this forge computes, labelled, and
experiments/vidur_reference.py refuses an attention.csv that is not the one its checkout's label names."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from benchmarks import vidur_attention_profile as vap
from forge.sim.cost_model import BatchShape

REPO = Path(__file__).resolve().parent.parent
# The header of Vidur's measured A100 / Llama-2-7B attention.csv (Git LFS oid sha256:4e3ddcf0...), as its
# profiler (vidur/profiling/attention) writes it: four operators' stats, then the shape columns.
VIDUR_HEADER = (
    "time_stats.attn_input_reshape.min,time_stats.attn_input_reshape.max,time_stats.attn_input_reshape.mean,"
    "time_stats.attn_input_reshape.median,time_stats.attn_input_reshape.std,time_stats.attn_decode.min,"
    "time_stats.attn_decode.max,time_stats.attn_decode.mean,time_stats.attn_decode.median,"
    "time_stats.attn_decode.std,time_stats.attn_output_reshape.min,time_stats.attn_output_reshape.max,"
    "time_stats.attn_output_reshape.mean,time_stats.attn_output_reshape.median,time_stats.attn_output_reshape.std,"
    "time_stats.attn_prefill.min,time_stats.attn_prefill.max,time_stats.attn_prefill.mean,"
    "time_stats.attn_prefill.median,time_stats.attn_prefill.std,n_embd,n_q_head,n_kv_head,block_size,"
    "num_tensor_parallel_workers,max_model_len,batch_size,prefill_chunk_size,kv_cache_size,is_prefill,"
    "attention_backend"
)


@pytest.fixture(scope="module")
def profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vap") / "attention.csv"
    vap.main(["--out", str(path)])
    return path


def row_of(df: pd.DataFrame, batch: int, chunk: int, kv: int) -> pd.Series:
    hit = df[(df.batch_size == batch) & (df.prefill_chunk_size == chunk) & (df.kv_cache_size == kv)]
    assert len(hit) == 1, (batch, chunk, kv)
    return hit.iloc[0]


def test_the_header_is_vidurs_and_the_rows_are_labelled_computed(profile: Path) -> None:
    lines = profile.read_text().splitlines()
    assert lines[0] == VIDUR_HEADER
    df = pd.read_csv(profile)
    assert set(df.attention_backend) == {"forge_operators_a100"}
    assert (
        (df[["n_embd", "n_q_head", "n_kv_head", "block_size", "num_tensor_parallel_workers"]] == [4096, 32, 32, 16, 1])
        .all()
        .all()
    )
    decode, prefill = df[df.prefill_chunk_size == 0], df[df.prefill_chunk_size > 0]
    assert not decode.is_prefill.any() and prefill.is_prefill.all() and (prefill.batch_size == 1).all()
    assert (
        decode["time_stats.attn_prefill.median"].isna().all() and prefill["time_stats.attn_decode.median"].isna().all()
    )
    assert (df["time_stats.attn_input_reshape.median"] == 0).all()
    # Vidur predicts decode at every batch 1-128 and every 64th context: the runs' contexts (to 1,024) are rows
    for kv in range(64, 1025, 64):
        assert sorted(decode[decode.kv_cache_size == kv].batch_size) == list(range(1, 129))
    assert (
        prefill.prefill_chunk_size.max() == 4096 and (prefill.prefill_chunk_size + prefill.kv_cache_size <= 4096).all()
    )


def test_rows_are_what_forge_charges_for_the_same_steps(profile: Path) -> None:
    """A step of forge = layers x (dense part + the profile's attention) + the once-per-step terms."""
    df, cost = pd.read_csv(profile), vap.forge_cost_model()
    layers = cost.dims.num_layers
    for batch, kv in ((1, 64), (37, 576), (128, 640), (128, 4096)):
        attn = row_of(df, batch, 0, kv)["time_stats.attn_decode.median"] / 1e3
        terms = cost.terms(batch)
        step = cost.step_time(BatchShape(query_lens=[1] * batch, seq_lens=[kv + 1] * batch, num_sampled=batch))
        assert step == pytest.approx(layers * (terms.dense + attn) + terms.head + terms.embed, rel=1e-12)
    for chunk, kv in ((512, 0), (1024, 0), (16, 0), (960, 1024), (64, 3840)):
        attn = row_of(df, 1, chunk, kv)["time_stats.attn_prefill.median"] / 1e3
        terms, head = cost.terms(chunk), cost.terms(1).head
        step = cost.step_time(BatchShape(query_lens=[chunk], seq_lens=[kv + chunk], num_sampled=1))
        assert step == pytest.approx(layers * (terms.dense + attn) + head + terms.embed, rel=1e-12)
    # keys cached before the step: 4·heads·head_dim FLOPs per (query, key) pair at the preset's cached efficiency
    extra = (
        row_of(df, 1, 1024, 1024)["time_stats.attn_prefill.median"]
        - row_of(df, 1, 1024, 0)["time_stats.attn_prefill.median"]
    )
    c = cost.c
    assert c.prefill_cached_attn_flops_efficiency is not None
    per_pair_ms = 4 * 32 * 128 / (c.peak_flops * c.prefill_cached_attn_flops_efficiency) * 1e3
    assert extra == pytest.approx(1024 * 1024 * per_pair_ms, rel=1e-9)


def test_the_same_forge_writes_the_same_bytes(profile: Path, tmp_path: Path) -> None:
    again = tmp_path / "again.csv"
    digest = vap.write(again)
    assert digest == hashlib.sha256(profile.read_bytes()).hexdigest() == hashlib.sha256(again.read_bytes()).hexdigest()


def setup_script(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "VIDUR_VENV": str(tmp_path / "venv"),
        "VIDUR_SRC": str(tmp_path / "src"),
        "PYTHON": sys.executable,
    }
    cmd = ["bash", str(REPO / "benchmarks/vidur_setup.sh"), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


def test_setup_takes_a_computed_profile_only_if_it_is_what_this_forge_computes(profile: Path, tmp_path: Path) -> None:
    edited = tmp_path / "edited.csv"
    edited.write_text(profile.read_text().replace("forge_operators_a100", "AttentionBackend.FLASH_ATTENTION", 1))
    proc = setup_script(tmp_path, "--computed-attention", str(tmp_path / "no-mirror"), str(edited))
    assert proc.returncode == 1 and "not " + hashlib.sha256(profile.read_bytes()).hexdigest() in proc.stderr
    assert "what python -m benchmarks.vidur_attention_profile computes" in proc.stderr
    # the right file passes the digest check and stops at the next one (no mirror here): nothing written
    proc = setup_script(tmp_path, "--computed-attention", str(tmp_path / "no-mirror"), str(profile))
    assert proc.returncode == 1 and "no-mirror is not a git directory" in proc.stderr, proc.stderr
    # without the flag the same file is refused: it is not Vidur's measured profile
    proc = setup_script(tmp_path, str(tmp_path / "no-mirror"), str(profile))
    assert proc.returncode == 1 and "not Vidur's 4e3ddcf0" in proc.stderr
    assert not (tmp_path / "src").exists()


def test_vidur_reference_refuses_an_attention_file_its_label_does_not_name(profile: Path, tmp_path: Path) -> None:
    checkout = tmp_path / "vidur-src"
    target = checkout / "data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/attention.csv"
    target.parent.mkdir(parents=True)
    target.write_bytes(profile.read_bytes())
    digest = hashlib.sha256(profile.read_bytes()).hexdigest()
    cmd = [sys.executable, str(REPO / "experiments/vidur_reference.py"), "--qps=1", f"--out={tmp_path / 'r.csv'}"]
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "run it from Vidur's source checkout" in proc.stderr  # no label at all
    (checkout / "ATTENTION_PROFILE").write_text(f"label=measured\nsha256={'0' * 64}\n")
    proc = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and f"(sha256 {digest}) is not the profile ATTENTION_PROFILE names" in proc.stderr
