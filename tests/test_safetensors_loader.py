"""Hugging Face directories (config.json, tokenizer.json, sharded safetensors) load to the same model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from forge.models.llama import Llama, LlamaConfig, random_state_dict
from forge.models.safetensors_loader import CheckpointError, load_safetensors
from tests.forward_helpers import prefill_logits
from tests.gguf_fixtures import byte_level_vocab, tiny_config


def write_hf_dir(directory: Path, shards: int = 2) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    tokens, merges = byte_level_vocab()
    config = tiny_config(len(tokens))
    state = {k: v.float().contiguous() for k, v in random_state_dict(config, seed=3).items()}
    names = sorted(state)
    weight_map = {n: f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors" for i, n in enumerate(names)}
    for file in set(weight_map.values()):
        save_file({n: state[n] for n in names if weight_map[n] == file}, str(directory / file))
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "vocab_size": config.vocab_size,
                "hidden_size": config.hidden_size,
                "intermediate_size": config.intermediate_size,
                "num_hidden_layers": config.num_layers,
                "num_attention_heads": config.num_heads,
                "num_key_value_heads": config.num_kv_heads,
                "rms_norm_eps": config.rms_norm_eps,
                "rope_theta": config.rope_theta,
                "max_position_embeddings": config.max_position,
                "tie_word_embeddings": False,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "torch_dtype": "float32",
            }
        )
    )
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(tokens)}, merges=[(a, b) for a, _, b in (m.partition(" ") for m in merges)]
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}",
            }
        )
    )
    return config, state


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaConfig, dict[str, torch.Tensor]]:
    directory = tmp_path_factory.mktemp("hf")
    config, state = write_hf_dir(directory)
    return directory, config, state


def test_sharded_checkpoint_same_logits(hf_dir: tuple[Path, LlamaConfig, dict[str, torch.Tensor]]) -> None:
    directory, config, state = hf_dir
    model = load_safetensors(str(directory))
    assert model.config == config
    reference = Llama.from_state_dict(config, state, model.tokenizer)
    ids = model.tokenizer.encode("the theory of the quick world")
    torch.testing.assert_close(prefill_logits(model, ids), prefill_logits(reference, ids), rtol=0, atol=0)
    assert model.tokenizer.eos_token_ids == {2}
    assert model.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"


def test_dtype_selection(hf_dir: tuple[Path, LlamaConfig, dict[str, torch.Tensor]]) -> None:
    model = load_safetensors(str(hf_dir[0]), dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and model.kv_spec.dtype == torch.bfloat16


def test_matches_transformers(hf_dir: tuple[Path, LlamaConfig, dict[str, torch.Tensor]]) -> None:
    transformers = pytest.importorskip("transformers")
    directory = hf_dir[0]
    ours = load_safetensors(str(directory))
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    ids = ours.tokenizer.encode("Hello world! the theory")
    with torch.no_grad():
        expected = theirs(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(prefill_logits(ours, ids), expected, rtol=0, atol=1e-4)


def test_bad_directories(tmp_path: Path, hf_dir: tuple[Path, LlamaConfig, dict[str, torch.Tensor]]) -> None:
    with pytest.raises(CheckpointError, match="not a directory"):
        load_safetensors(str(tmp_path / "nope"))
    with pytest.raises(CheckpointError, match="no config.json"):
        load_safetensors(str(tmp_path))
    bad = tmp_path / "gpt"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match="model_type 'gpt2' is not supported"):
        load_safetensors(str(bad))
    cut = tmp_path / "cut"
    cut.mkdir()
    write_hf_dir(cut)
    shard = next(cut.glob("model-00001-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model-00001-of-00002\.safetensors: unreadable"):
        load_safetensors(str(cut))
    next(cut.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(CheckpointError, match="missing weight file"):
        load_safetensors(str(cut))
