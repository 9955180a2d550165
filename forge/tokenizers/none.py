"""``model.tokenizer=none``: a checkpoint used with token ids only (vLLM's ``skip_tokenizer_init``).

``NoTokenizer`` knows the ids a model needs without text: the vocabulary size and the BOS/EOS ids
of ``config.json`` (and ``generation_config.json``). Anything that needs text (``encode``, a chat
render) raises ``TokenizerRequired``, a ``ValueError`` naming the setting; ``decode`` gives ``""``,
as vLLM gives an empty ``text`` without a tokenizer (the token ids carry the output)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from forge.tokenizers.base import Tokenizer, read_json_object

SETTING = "model.tokenizer=none"
CHOICES = ("auto", "none")  # auto: the checkpoint's tokenizer files


class TokenizerRequired(ValueError):
    """Text was asked of a model loaded without a tokenizer."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} needs a tokenizer, and this model was loaded with {SETTING} (token ids only)")


class NoTokenizer(Tokenizer):
    """Token ids only: ``vocab_size``, ``bos_token_id`` and ``eos_token_ids``, no text."""

    def __init__(self, vocab_size: int, bos_token_id: int | None, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        raise TokenizerRequired("a text prompt")

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return ""

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        raise TokenizerRequired("a chat")


def has_text(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer`` turns text into ids (False for ``model.tokenizer=none``)."""
    return not isinstance(tokenizer, NoTokenizer)


def _ids(value: Any) -> set[int]:
    if isinstance(value, int):
        return {value}
    return {v for v in value if isinstance(v, int)} if isinstance(value, list) else set()


def no_tokenizer_from_hf(directory: str, vocab_size: int) -> NoTokenizer:
    """The ids of the Hugging Face directory's ``config.json`` and ``generation_config.json``."""
    model = read_json_object(os.path.join(directory, "config.json"))
    generation = read_json_object(os.path.join(directory, "generation_config.json"))
    bos = next(iter(sorted(_ids(model.get("bos_token_id")))), None)
    eos = frozenset(_ids(model.get("eos_token_id")) | _ids(generation.get("eos_token_id")))
    return NoTokenizer(vocab_size, bos, eos)


def refuse_text_params(tokenizer: Tokenizer, stop: Sequence[str], structured: bool) -> None:
    """``TokenizerRequired`` for stop strings or structured output on a ``model.tokenizer=none`` model
    (both read the output's text)."""
    if has_text(tokenizer):
        return
    if stop:
        raise TokenizerRequired("a stop string")
    if structured:
        raise TokenizerRequired("structured output")
