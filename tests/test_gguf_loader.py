"""Tiny GGUF files written here round-trip through the loader to the same model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.gguf_loader import config_from_gguf, load_gguf
from forge.models.llama import Llama
from tests.forward_helpers import prefill_logits
from tests.gguf_fixtures import write_tiny_gguf

T = GGMLQuantizationType
CASES = [
    ("llama", "gpt2", T.F32, False),
    ("llama", "gpt2", T.Q8_0, True),
    ("llama", "llama", T.Q4_0, False),
    ("qwen2", "gpt2", T.Q4_1, False),
]


@pytest.mark.parametrize(("arch", "vocab", "qtype", "tie"), CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_round_trip_same_logits(tmp_path: Path, arch: str, vocab: str, qtype: GGMLQuantizationType, tie: bool) -> None:
    path = tmp_path / "tiny.gguf"
    config, state = write_tiny_gguf(path, arch, vocab, qtype, tie=tie)
    model = load_gguf(str(path))
    assert model.config.rms_norm_eps == pytest.approx(config.rms_norm_eps)  # stored as float32
    assert dataclasses.replace(model.config, rms_norm_eps=config.rms_norm_eps) == dataclasses.replace(
        config, tie_word_embeddings=tie
    )
    reference = Llama.from_state_dict(model.config, state, model.tokenizer)
    ids = model.tokenizer.encode("the theory of the quick brown world")
    assert len(ids) > 4
    torch.testing.assert_close(prefill_logits(model, ids), prefill_logits(reference, ids), rtol=0, atol=0)


def test_dtype_and_max_position(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    model = load_gguf(str(path), dtype="bfloat16", max_position=64)
    assert model.dtype == torch.bfloat16 and model.max_position == 64
    assert prefill_logits(model, [5, 6, 7]).dtype == torch.float32


def test_rope_freqs_tensor_becomes_frequency_factors(tmp_path: Path) -> None:
    path = tmp_path / "rope.gguf"
    w = GGUFWriter(str(path), arch="llama")
    for key, value in (("block_count", 1), ("embedding_length", 64), ("feed_forward_length", 96)):
        w.add_uint32(f"llama.{key}", value)
    w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.zeros((10, 64), np.float32))
    w.add_tensor("rope_freqs.weight", np.full(8, 2.0, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = config_from_gguf(GGUFFile(path))
    assert config.rope_scaling == {"rope_type": "freq_factors", "factors": [2.0] * 8}


def test_missing_file() -> None:
    with pytest.raises(GGUFError, match=r"/nonexistent/model\.gguf: no such GGUF file"):
        load_gguf("/nonexistent/model.gguf")


def test_not_a_gguf(tmp_path: Path) -> None:
    path = tmp_path / "junk.gguf"
    path.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(GGUFError, match=r"junk\.gguf: not a readable GGUF"):
        load_gguf(str(path))


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "cut.gguf"
    write_tiny_gguf(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(GGUFError, match=r"cut\.gguf: .*truncated|cut\.gguf: not a readable"):
        load_gguf(str(path))


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "arch.gguf"
    write_tiny_gguf(path, arch="gptneox")
    with pytest.raises(GGUFError, match=r"arch\.gguf: architecture 'gptneox' is not supported"):
        load_gguf(str(path))


def test_unsupported_tensor_type(tmp_path: Path) -> None:
    path = tmp_path / "iq.gguf"
    write_tiny_gguf(path)
    w = GGUFWriter(str(tmp_path / "iq2.gguf"), arch="llama")
    src = GGUFFile(path)
    for key, value in src.metadata.items():
        if key.startswith("llama."):
            w.add_uint32(key, value) if isinstance(value, int) else w.add_float32(key, value)
    w.add_tensor("token_embd.weight", np.zeros((16, 66), np.uint8), raw_shape=(16, 66), raw_dtype=T.IQ2_XXS)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match=r"iq2\.gguf: unsupported tensor types: token_embd\.weight \(IQ2_XXS\)"):
        load_gguf(str(tmp_path / "iq2.gguf"))


def test_the_lean_reader_reads_what_gguf_py_reads(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, "llama", "llama", GGMLQuantizationType.Q4_0)
    ours, reference = GGUFFile(path), GGUFReader(str(path))
    expected = {name: f.contents() for name, f in reference.fields.items() if not name.startswith("GGUF.")}
    assert ours.metadata == expected and any(isinstance(v, list) and len(v) > 100 for v in expected.values())
    assert list(ours.tensors) == [t.name for t in reference.tensors]
    for t in reference.tensors:
        assert ours.tensor_shape(t.name) == tuple(reversed(t.shape.tolist()))
        assert ours.tensor_type(t.name) == t.tensor_type
        assert np.array_equal(ours.raw(t.name), np.asarray(t.data).reshape(-1).view(np.uint8))
