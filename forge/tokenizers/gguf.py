"""A ``tokenizers.Tokenizer`` rebuilt from the vocabulary a GGUF file stores in its metadata.

Two vocabularies (``tokenizer.ggml.model``):

- ``gpt2``: byte-level BPE, vocab + merges, split regex chosen by ``tokenizer.ggml.pre``
  as llama.cpp does (``smollm`` isolates each digit, ``llama-bpe`` uses the Llama-3
  regex...). An unknown ``pre`` is an error rather than a silently different tokenization.
- ``llama``: SentencePiece BPE with byte fallback; merges recovered from the scores the
  way Hugging Face's converter does, ``▁`` prepended to the text (``add_space_prefix``).
  Gemma files (``general.architecture`` gemma/gemma2/gemma3) need two fixes, as in
  transformers' ``gemma_tokenizer``: their runs of spaces are stored as real spaces (spelled
  back as ``▁``), and their merges rank by position in the vocabulary, not by score. As in
  llama.cpp, ``<end_of_turn>`` also ends generation there.

Tokens the file types CONTROL become special tokens (skipped on decode); USER_DEFINED
ones are matched whole but kept on decode. BOS/EOS are added as ``add_bos_token`` /
``add_eos_token`` say, defaulting like llama.cpp (BOS on for SentencePiece and Llama-3).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as Backend

from forge.tokenizers.hf import HFTokenizer, special_tokens_processor

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# ``tokenizer.ggml.pre`` -> the regexes llama.cpp splits with, applied in order.
PRE_TOKENIZER_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "llama-v3": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,),
    "falcon3": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
    "deepseek-r1-qwen": (_QWEN2_SPLIT,),
}
_BOS_BY_DEFAULT = {"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "falcon3"}
_GEMMA_ARCHITECTURES = {"gemma", "gemma2", "gemma3"}
_GEMMA_END_OF_TURN = "<end_of_turn>"


class GGUFTokenizerError(ValueError):
    """The file's vocabulary cannot be turned into a tokenizer."""


def _byte_level(meta: Mapping[str, Any], tokens: Sequence[str]) -> Backend:
    pre = meta.get("tokenizer.ggml.pre") or "default"
    if pre not in PRE_TOKENIZER_SPLITS:
        raise GGUFTokenizerError(
            f"tokenizer.ggml.pre {pre!r} is not supported (supported: {', '.join(sorted(PRE_TOKENIZER_SPLITS))})"
        )
    merges_raw = meta.get("tokenizer.ggml.merges")
    if not merges_raw:
        raise GGUFTokenizerError("byte-level BPE vocabulary without tokenizer.ggml.merges")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in merges_raw]
    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_SPLITS[pre]]
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    backend.decoder = decoders.ByteLevel()
    return backend


def sentencepiece_merges(tokens: Sequence[str], scores: Sequence[float]) -> list[tuple[str, str]]:
    """BPE merges implied by a SentencePiece vocabulary: every split of a piece into two
    pieces of the vocabulary, best score first (HF's ``generate_merges``)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    ranked: list[tuple[str, str, float]] = []
    for piece, score in zip(tokens, scores, strict=True):
        local = [
            (piece[:k], piece[k:], score) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab
        ]
        ranked.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    ranked.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in ranked]


def _sentencepiece(meta: Mapping[str, Any], tokens: Sequence[str], gemma: bool) -> Backend:
    scores = meta.get("tokenizer.ggml.scores")
    if not scores:
        raise GGUFTokenizerError("SentencePiece vocabulary without tokenizer.ggml.scores")
    if gemma:  # Gemma's scores do not follow its merge order; the order of the vocabulary does
        scores = [-float(i) for i in range(len(tokens))]
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) else None
    vocab = {tok: i for i, tok in enumerate(tokens)}
    model = models.BPE(
        vocab=vocab,
        merges=sentencepiece_merges(tokens, scores),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = Backend(model)
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first" if add_prefix else "never", split=False
    )
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*steps, decoders.Strip(content=" ", left=1, right=0)] if add_prefix else steps)
    return backend


def tokenizer_from_gguf(meta: Mapping[str, Any]) -> HFTokenizer:
    """The tokenizer described by a GGUF file's ``tokenizer.*`` metadata."""
    kind = meta.get("tokenizer.ggml.model")
    tokens: Any = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFTokenizerError("metadata lacks tokenizer.ggml.tokens")
    gemma = kind == "llama" and meta.get("general.architecture") in _GEMMA_ARCHITECTURES
    if gemma:  # runs of spaces are stored as spaces; the vocabulary spells them with ▁
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    if kind == "gpt2":
        backend = _byte_level(meta, tokens)
        add_bos_default = meta.get("tokenizer.ggml.pre") in _BOS_BY_DEFAULT
    elif kind == "llama":
        backend = _sentencepiece(meta, tokens, gemma)
        add_bos_default = True
    else:
        raise GGUFTokenizerError(f"tokenizer.ggml.model {kind!r} is not supported (supported: gpt2, llama)")

    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    backend.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TOKEN_TYPE_CONTROL
        ]
    )
    backend.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TOKEN_TYPE_USER_DEFINED
        ]
    )

    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    eos_ids = {eos_id} if isinstance(eos_id, int) else set()
    eot_id = meta.get("tokenizer.ggml.eot_token_id")  # end of turn (Llama-3 <|eot_id|>)
    if isinstance(eot_id, int):
        eos_ids.add(eot_id)
    elif gemma and _GEMMA_END_OF_TURN in tokens:
        eos_ids.add(tokens.index(_GEMMA_END_OF_TURN))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos_default)) and isinstance(bos_id, int)
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and isinstance(eos_id, int)
    backend.post_processor = special_tokens_processor(
        backend, tokens[bos_id] if add_bos else None, tokens[eos_id] if add_eos else None
    )
    pad_id = meta.get("tokenizer.ggml.padding_token_id")
    return HFTokenizer(
        backend,
        bos_id if isinstance(bos_id, int) else None,
        eos_ids,
        meta.get("tokenizer.chat_template"),
        pad_id if isinstance(pad_id, int) else None,
    )
