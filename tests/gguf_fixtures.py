"""Tiny GGUF files written in the test with ``gguf.GGUFWriter``: random Llama weights plus a
byte-level BPE (trained here on a few sentences) or a SentencePiece-style vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, quants
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from forge.models.llama import LlamaConfig, random_state_dict

CORPUS = [
    "The quick brown fox jumps over the lazy dog. def main():\n    return 42\n",
    "Hello world! Héllo wörld, 你好 世界 🚀 tabs\tand  spaces   here.\n\n",
    "the theory of the thing: there, then, them, these, those 0123456789",
]
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_level_vocab(vocab_size: int = 400) -> tuple[list[str], list[str]]:
    """Tokens (specials first) and merges of a byte-level BPE trained on ``CORPUS``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    model = json.loads(tok.to_str())["model"]
    vocab: dict[str, int] = model["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    return tokens, merges


def sentencepiece_vocab() -> tuple[list[str], list[float], list[int]]:
    """A small SentencePiece-style vocab: <unk> <s> </s>, 256 byte tokens, then scored pieces."""
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)]]
    types = [2, 3, 3, *[6] * 256]
    chars = sorted(set("".join(CORPUS).replace(" ", "▁")) - {"\n", "\t"})
    pieces = [
        "▁t",
        "he",
        "▁the",
        "in",
        "▁a",
        "er",
        "▁w",
        "or",
        "▁wor",
        "ld",
        "▁world",
        "ll",
        "▁he",
        "llo",
        "▁hello",
        "▁th",
        "en",
        "▁then",
        "▁The",
        "ck",
        "ui",
        "▁qu",
        "▁qui",
        "▁quick",
    ]
    pieces = [p for p in pieces if p not in chars]
    scores = [0.0] * len(tokens)
    for i, piece in enumerate([*chars, *pieces]):
        tokens.append(piece)
        types.append(1)
        # chars score low (never merged into), merges ranked by order
        scores.append(-1000.0 - i if piece in chars else -float(i))
    return tokens, scores, types


def tiny_config(vocab_size: int, attention_bias: bool = False) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=96,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_position=256,
        rope_theta=10000.0,
        attention_bias=attention_bias,
    )


def permute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (``convert_hf_to_gguf.LlamaModel.permute``)."""
    return (
        weight.reshape(n_head, 2, weight.shape[0] // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


_GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        idx, rest = hf[len("model.layers.") :].split(".", 1)
        return f"blk.{idx}.{_GGUF_NAMES[rest]}"
    return {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }[hf]


def write_tiny_gguf(
    path: Path,
    arch: str = "llama",
    vocab: str = "gpt2",
    qtype: GGMLQuantizationType = GGMLQuantizationType.F32,
    seed: int = 0,
    tie: bool = False,
    chat_template: str = CHAT_TEMPLATE,
) -> tuple[LlamaConfig, dict[str, torch.Tensor]]:
    """Write a tiny model and return its config and the float32 state dict the file encodes
    (after quantization round trip), in Hugging Face naming and layout."""
    if vocab == "gpt2":
        tokens, merges = byte_level_vocab()
        types = [3 if t in SPECIAL else 1 for t in tokens]
    else:
        tokens, scores, types = sentencepiece_vocab()
    config = tiny_config(len(tokens), attention_bias=arch == "qwen2")
    state = {k: v.float() for k, v in random_state_dict(config, seed).items()}
    if config.attention_bias:
        g = torch.Generator().manual_seed(seed + 1)
        for i in range(config.num_layers):
            for n, rows in (("q", config.num_heads), ("k", config.num_kv_heads), ("v", config.num_kv_heads)):
                state[f"model.layers.{i}.self_attn.{n}_proj.bias"] = 0.1 * torch.randn(rows * 16, generator=g)
    if tie:
        del state["lm_head.weight"]

    w = GGUFWriter(str(path), arch=arch)
    w.add_block_count(config.num_layers)
    w.add_context_length(config.max_position)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_heads)
    w.add_head_count_kv(config.num_kv_heads)
    w.add_rope_freq_base(config.rope_theta)
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_rope_dimension_count(config.head_dim)
    w.add_tokenizer_model(vocab)
    w.add_token_list(tokens)
    w.add_token_types(types)
    if vocab == "gpt2":
        w.add_tokenizer_pre("smollm")
        w.add_token_merges(merges)
        w.add_bos_token_id(tokens.index("<|im_start|>"))
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_add_bos_token(False)
        w.add_chat_template(chat_template)
    else:
        w.add_token_scores(scores)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    encoded: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        data = tensor.numpy().astype(np.float32)
        stored = data
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_heads if "q_proj" in name else config.num_kv_heads
            stored = permute_qk(data, heads)
        if data.ndim == 2 and qtype != GGMLQuantizationType.F32:
            raw = quants.quantize(stored, qtype)
            w.add_tensor(gguf_name(name), raw, raw_shape=raw.shape, raw_dtype=qtype)
            back = quants.dequantize(raw, qtype)
            if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
                back = permute_qk_inverse(back, heads)
            encoded[name] = torch.from_numpy(np.ascontiguousarray(back))
        else:
            w.add_tensor(gguf_name(name), stored)
            encoded[name] = tensor.clone()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return config, encoded


def permute_qk_inverse(weight: np.ndarray, n_head: int) -> np.ndarray:
    return (
        weight.reshape(n_head, weight.shape[0] // n_head // 2, 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )
