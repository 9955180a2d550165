"""What of the CUDA backend runs without a GPU: the clear failure, the import guarantees,
the GGUF block formats (against the gguf package), and the graph runner's eager path."""

from __future__ import annotations

import importlib

import pytest
import torch

from forge.kernels.base import AttentionMetadata
from forge.kernels.batch import ForwardBatch
from forge.kernels.cuda import compiler
from forge.kernels.cuda.quant import GGMLType, QuantizedWeight, dequantize_rows, quantize_q8_0, random_q4_k
from forge.kernels.cuda_graphs import GraphRunner, default_buckets
from forge.kernels.torch_backend import TorchBackend
from forge.models.llama import build_tiny


def test_modules_import_without_cuda_or_cupy() -> None:
    for name in ("forge.kernels.cuda_backend", "forge.kernels.cuda_graphs", "forge.kernels.cuda.ops"):
        importlib.import_module(name)


def test_constructing_without_cuda_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from forge.kernels.cuda_backend import CudaBackend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="backend=torch") as err:
        CudaBackend()
    assert "CUDA GPU" in str(err.value)


def test_constructing_without_cupy_raises_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from forge.kernels.cuda_backend import CudaBackend

    def no_cupy() -> None:
        raise ImportError("No module named 'cupy'")

    monkeypatch.setattr(compiler, "import_cupy", no_cupy)
    with pytest.raises(RuntimeError, match="backend=torch") as err:
        CudaBackend()
    assert "CuPy" in str(err.value) and "cupy-cuda12x" in str(err.value)


def test_missing_requirements_on_this_machine() -> None:
    missing = compiler.missing_requirements()
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert any("CUDA GPU" in m for m in missing)


@pytest.mark.parametrize("seed", [0, 1])
def test_q4_k_dequantization_matches_gguf(seed: int) -> None:
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize

    w = random_q4_k(512, 9, torch.Generator().manual_seed(seed))
    expected = dequantize(w.data.numpy(), gguf.GGMLQuantizationType.Q4_K)
    assert torch.equal(dequantize_rows(w), torch.from_numpy(expected))


def test_q8_0_quantize_and_dequantize_match_gguf() -> None:
    gguf = pytest.importorskip("gguf")
    from gguf.quants import dequantize, quantize

    dense = torch.randn(96, 7, generator=torch.Generator().manual_seed(0))  # [in, out]
    q = quantize_q8_0(dense)
    theirs = quantize(dense.t().contiguous().numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(q.data, torch.from_numpy(theirs))
    expected = dequantize(q.data.numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert torch.equal(dequantize_rows(q), torch.from_numpy(expected))
    assert (dequantize_rows(q).t() - dense).abs().max() <= dense.abs().max() / 127


def test_quantized_weight_validation_and_concat() -> None:
    a, b = random_q4_k(256, 3), random_q4_k(256, 5)
    both = QuantizedWeight.cat_out([a, b])
    assert both.shape == (256, 8)
    assert torch.equal(dequantize_rows(both), torch.cat((dequantize_rows(a), dequantize_rows(b))))
    with pytest.raises(ValueError):
        QuantizedWeight(GGMLType.Q8_0, torch.zeros(4, 33, dtype=torch.uint8), 32, 4)
    with pytest.raises(ValueError):
        QuantizedWeight.cat_out([a, quantize_q8_0(torch.randn(256, 2))])


def test_default_buckets() -> None:
    assert default_buckets(1) == [1]
    assert default_buckets(6) == [1, 2, 4, 6]
    assert default_buckets(40) == [1, 2, 4, 8, 16, 32, 40]
    assert default_buckets(64)[-2:] == [48, 64]


def _decode_batch(n: int, seq_len: int, block_size: int, query_len: int = 1) -> ForwardBatch:
    tokens = n * query_len
    meta = AttentionMetadata(
        query_start_loc=torch.arange(0, tokens + 1, query_len),
        seq_lens=torch.full((n,), seq_len),
        block_tables=torch.arange(n * 4).view(n, 4),
        slot_mapping=torch.arange(tokens),
        block_size=block_size,
        query_lens_cpu=[query_len] * n,
        seq_lens_cpu=[seq_len] * n,
    )
    return ForwardBatch(
        torch.zeros(tokens, dtype=torch.long),
        torch.zeros(tokens, dtype=torch.long),
        meta,
        torch.arange(query_len - 1, tokens, query_len),
    )


def test_graph_runner_is_eager_on_cpu_and_picks_buckets() -> None:
    model = build_tiny()
    backend = TorchBackend("cpu")
    kv = backend.allocate_kv_cache(model.kv_spec, 64, 16)
    runner = GraphRunner(model, kv, backend, max_num_seqs=40, max_blocks_per_seq=4)
    assert not runner.enabled  # CPU tensors and a backend without graph support
    batch = _decode_batch(3, 5, 16)
    assert runner.bucket_for(batch) is None
    logits = runner.run(batch)
    kv2 = backend.allocate_kv_cache(model.kv_spec, 64, 16)
    assert torch.equal(logits, model.forward(batch, kv2, backend))

    runner.enabled = True  # only the decision logic below; nothing is captured
    assert runner.bucket_for(_decode_batch(3, 5, 16)) == 4
    assert runner.bucket_for(_decode_batch(17, 64, 16)) == 32
    assert runner.bucket_for(_decode_batch(40, 64, 16)) == 40
    assert runner.bucket_for(_decode_batch(41, 5, 16)) is None  # oversize: eager
    assert runner.bucket_for(_decode_batch(2, 65, 16)) is None  # beyond max_blocks_per_seq * block_size
    assert runner.bucket_for(_decode_batch(2, 8, 16, query_len=3)) is None  # prefill: eager
    assert runner.bucket_for(_decode_batch(2, 8, 8)) is None  # another block size
