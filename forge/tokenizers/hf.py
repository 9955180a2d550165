"""Tokenizers backed by Hugging Face ``tokenizers``: from a ``tokenizer.json`` directory, or
built from GGUF metadata (``forge.tokenizers.gguf``).

BOS/EOS insertion lives in the backend's post-processor, as in HF: ``encode(text)`` adds
what the file says, ``encode(text, add_special_tokens=False)`` adds nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from tokenizers import Tokenizer as Backend
from tokenizers import processors

from forge.tokenizers.base import Tokenizer, read_json_object


def special_tokens_processor(backend: Backend, bos: str | None, eos: str | None) -> processors.TemplateProcessing:
    """Post-processor adding ``bos`` in front and ``eos`` at the end (either may be None)."""
    single = " ".join([*([bos] if bos else []), "$A", *([eos] if eos else [])])
    pair = " ".join(
        [
            *([bos] if bos else []),
            "$A",
            *([eos] if eos else []),
            *([bos] if bos else []),
            "$B",
            *([eos] if eos else []),
        ]
    )
    present = [t for t in dict.fromkeys([bos, eos]) if t]
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(t, backend.token_to_id(t)) for t in present]
    )


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` with the BOS/EOS ids and chat template of its model file."""

    def __init__(
        self,
        backend: Backend,
        bos_token_id: int | None,
        eos_token_ids: Iterable[int],
        chat_template: str | None = None,
        pad_token_id: int | None = None,
    ) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = frozenset(eos_token_ids)
        self.pad_token_id = pad_token_id
        self.chat_template = chat_template
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def special_token_ids(self) -> frozenset[int]:
        """BOS, EOS and every token the file marks special (control tokens like ``<|im_start|>``)."""
        added = {i for i, t in self.backend.get_added_tokens_decoder().items() if t.special}
        return super().special_token_ids() | frozenset(added)

    def token(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    def template_tokens(self) -> dict[str, str | None]:
        eos = min(self.eos_token_ids) if self.eos_token_ids else None
        return {
            "bos_token": self.token(self.bos_token_id),
            "eos_token": self.token(eos),
            "pad_token": self.token(self.pad_token_id),
        }


def _token_content(value: Any) -> str | None:
    """``tokenizer_config.json`` spells special tokens as strings or ``{"content": ...}``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    return [v for v in value if isinstance(v, int)] if isinstance(value, list) else []


def _chat_template(directory: str, tok_config: dict[str, Any]) -> str | None:
    jinja_path = os.path.join(directory, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    template = tok_config.get("chat_template") or read_json_object(os.path.join(directory, "chat_template.json")).get(
        "chat_template"
    )
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    return template if isinstance(template, str) else None


def load_hf_tokenizer(directory: str) -> HFTokenizer:
    """The tokenizer of a Hugging Face model directory (``tokenizer.json`` required).

    EOS ids are the union of what ``config.json``, ``generation_config.json`` and
    ``tokenizer_config.json`` name (Llama-3 instruct ends turns on several tokens).
    An explicit ``add_bos_token``/``add_eos_token`` in ``tokenizer_config.json`` replaces
    the post-processor, as HF's Llama tokenizer does.
    """
    path = os.path.join(directory, "tokenizer.json")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{directory}: no tokenizer.json")
    backend = Backend.from_file(path)
    tok_config = read_json_object(os.path.join(directory, "tokenizer_config.json"))
    model_config = read_json_object(os.path.join(directory, "config.json"))
    gen_config = read_json_object(os.path.join(directory, "generation_config.json"))

    def token_id(name: str) -> int | None:
        content = _token_content(tok_config.get(name))
        return backend.token_to_id(content) if content else None

    bos_id = token_id("bos_token")
    if bos_id is None:
        bos_id = next(iter(_ids(model_config.get("bos_token_id"))), None)
    eos_ids = {*_ids(model_config.get("eos_token_id")), *_ids(gen_config.get("eos_token_id"))}
    if (tok_eos := token_id("eos_token")) is not None:
        eos_ids.add(tok_eos)
    if "add_bos_token" in tok_config or "add_eos_token" in tok_config:
        bos = backend.id_to_token(bos_id) if bos_id is not None and tok_config.get("add_bos_token") else None
        eos_name = _token_content(tok_config.get("eos_token"))
        eos = eos_name if tok_config.get("add_eos_token") else None
        backend.post_processor = special_tokens_processor(backend, bos, eos)
    return HFTokenizer(backend, bos_id, eos_ids, _chat_template(directory, tok_config), token_id("pad_token"))
