"""The arithmetic and batch building behind reports/cpu (benchmarks/roofline.py, cpu_report.py,
llama_cpp_batched.py), without llama.cpp or a model: a fake ``llama_batch`` and a tiny GGUF."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.cpu_report import Figure, Goal, greedy_agreement
from benchmarks.llama_cpp_batched import BatchEntry, decode_entries, prefill_chunks, write_batch
from benchmarks.roofline import (
    ModelShape,
    WeightBytes,
    decode_bytes_per_token,
    flops_per_token,
    gguf_weight_bytes,
    kv_bytes_per_position,
    mean_context,
    sequence_flops,
)

SMOLLM2 = ModelShape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)


def test_smollm2_shape_counts_its_linear_weights() -> None:
    # q, o: 576x576; k, v: 576x192; gate, up, down: 576x1536 -- per layer, 30 layers (the GGUF's 106168320)
    assert SMOLLM2.layer_params == 30 * (2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536) == 106_168_320
    assert SMOLLM2.head_params == 49152 * 576


def test_batch1_bytes_are_weights_once_plus_the_context_kv() -> None:
    fmt = WeightBytes(layer=0.625, head=1.0)
    weights = SMOLLM2.layer_params * 0.625 + SMOLLM2.head_params * 1.0
    assert kv_bytes_per_position(SMOLLM2, 4.0) == 30 * 2 * 3 * 64 * 4
    assert decode_bytes_per_token(SMOLLM2, fmt, 4.0, 100) == pytest.approx(weights + 100 * 46080)
    assert mean_context(128, 128) == 128 + 127 / 2


def test_sequence_flops_sum_the_positions_fed() -> None:
    shape = ModelShape(layers=2, hidden=8, heads=2, kv_heads=1, head_dim=4, ffn=16, vocab=10)
    # prompt of 3 + 4 outputs: 6 tokens are fed; the token at position p attends to p + 1 positions
    expected = sum(flops_per_token(shape, p + 1) for p in range(6))
    assert sequence_flops(shape, 3, 4) == pytest.approx(expected)


def test_gguf_weight_bytes_count_layers_and_the_tied_head(tmp_path: Path) -> None:
    import gguf

    shape = ModelShape(layers=1, hidden=32, heads=1, kv_heads=1, head_dim=32, ffn=32, vocab=64)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros((32, 32), dtype=np.float16))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float32))  # 1-D: not a matrix read
    writer.add_tensor("token_embd.weight", np.zeros((64, 32), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_weight_bytes(path, shape) == WeightBytes(layer=2.0, head=4.0)


def test_prefill_packs_whole_prompts_and_asks_logits_for_last_tokens() -> None:
    chunks = prefill_chunks([[1, 2, 3], [4, 5], [6, 7, 8]], n_batch=4)
    assert [len(c) for c in chunks] == [4, 4]
    flat = [e for c in chunks for e in c]
    assert [(e.token, e.pos, e.seq) for e in flat] == [
        (1, 0, 0), (2, 1, 0), (3, 2, 0), (4, 0, 1), (5, 1, 1), (6, 0, 2), (7, 1, 2), (8, 2, 2),
    ]  # fmt: skip
    assert [e.token for e in flat if e.logits] == [3, 5, 8]


def test_decode_step_feeds_each_sequence_its_last_token() -> None:
    assert decode_entries([7, 9], [128, 130]) == [BatchEntry(7, 128, 0, True), BatchEntry(9, 130, 1, True)]
    with pytest.raises(ValueError):
        decode_entries([7, 9], [128])


def test_write_batch_fills_the_c_struct_fields() -> None:
    cap = 4
    batch = SimpleNamespace(
        token=[0] * cap, pos=[0] * cap, n_seq_id=[0] * cap, seq_id=[[0] for _ in range(cap)], logits=[False] * cap
    )
    batch.n_tokens = 0
    write_batch(batch, [BatchEntry(5, 0, 2, False), BatchEntry(6, 1, 3, True)])
    assert batch.n_tokens == 2
    assert batch.token[:2] == [5, 6] and batch.pos[:2] == [0, 1] and batch.n_seq_id[:2] == [1, 1]
    assert [s[0] for s in batch.seq_id[:2]] == [2, 3] and batch.logits[:2] == [False, True]


def test_greedy_agreement_measures_prefixes() -> None:
    ref = [[1, 2, 3, 4], [1, 2, 3, 4]]
    agreement = greedy_agreement(ref, [[1, 2, 3, 4], [1, 9, 3, 4]])
    assert agreement.identical == 1 and agreement.prompts == 2
    assert agreement.mean_prefix == pytest.approx((1.0 + 0.25) / 2)
    with pytest.raises(ValueError):
        greedy_agreement(ref, ref[:1])


def test_goals_and_figures_say_what_was_measured() -> None:
    assert "**met**, 1.50x" in Goal("g", 150.0, 100.0, 1.5).line()
    assert "**not met**, 0.80x" in Goal("g", 80.0, 100.0, 1.0).line()
    assert "not measured" in Goal("g", None, 100.0, 1.0).line()
    assert Figure([3.0, 1.0, 2.0]).cell() == "2.0 (1.0-3.0)"
    assert Figure([2.5]).cell() == "2.5"
