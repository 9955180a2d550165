"""Tokenizer contract, incremental detokenization, and the byte-level tokenizer of the stand-ins."""

from __future__ import annotations

import json
import os
import random
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np


class Tokenizer(ABC):
    """Text <-> token ids. ``eos_token_ids`` end generation unless ``ignore_eos``."""

    bos_token_id: int | None
    eos_token_ids: frozenset[int]
    vocab_size: int
    chat_template: str | None = None  # a Jinja2 chat template (a model file's); None: a plain transcript

    @abstractmethod
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    @abstractmethod
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def special_token_ids(self) -> frozenset[int]:
        ids = set(self.eos_token_ids)
        if self.bos_token_id is not None:
            ids.add(self.bos_token_id)
        return frozenset(ids)

    def random_token_ids(self, n: int, rng: random.Random) -> list[int]:
        """``n`` seeded random ordinary tokens (no special ones), for synthetic prompts."""
        special = self.special_token_ids()
        out: list[int] = []
        while len(out) < n:
            tok = rng.randrange(self.vocab_size)
            if tok not in special:
                out.append(tok)
        return out

    def random_token_id_lists(self, lengths: Sequence[int], rng: random.Random) -> list[list[int]]:
        """``random_token_ids(n, rng)`` for each ``n`` of ``lengths`` in turn: the same lists, the
        generator left in the same state (a tokenizer may draw them together, faster)."""
        return [self.random_token_ids(n, rng) for n in lengths]

    def template_tokens(self) -> dict[str, str | None]:
        """The special tokens a chat template sees (``bos_token``, ``eos_token``, ``pad_token``)."""
        return {"bos_token": None, "eos_token": None, "pad_token": None}

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """Render a chat (``tools``: OpenAI tool definitions, given to the template as HF's
        ``tools=``; messages may hold ``tool_calls`` and ``tool_call_id``) with ``template`` or the
        tokenizer's own ``chat_template`` (Jinja2, rendered as Hugging Face does; the text then holds
        the template's special tokens: encode it with ``add_special_tokens=False``), given
        ``template_kwargs`` as further variables. Without a template: a plain transcript (tools and
        tool calls as JSON lines), which takes no ``template_kwargs`` (ValueError)."""
        source = template or self.chat_template
        if source:
            from forge.tokenizers.chat_template import render_chat

            extra = {**({"tools": tools} if tools else {}), **(template_kwargs or {})}
            return render_chat(source, messages, add_generation_prompt, self.template_tokens(), **extra)
        if template_kwargs:
            raise ValueError("the plain transcript (no chat template) takes no template variables")
        lines = [f"tools: {json.dumps(tools)}"] if tools else []
        for m in messages:
            lines.append(f"{m['role']}: {m['content']}")
            lines.extend(f"tool_call: {json.dumps(c['function'])}" for c in m.get("tool_calls") or [])
        if add_generation_prompt:
            lines.append("assistant:")
        return "\n".join(lines)

    def chat_template_variables(self, template: str | None = None) -> frozenset[str]:
        """The variables ``template`` (or the tokenizer's own template) reads; none without one."""
        source = template or self.chat_template
        if not source:
            return frozenset()
        from forge.tokenizers.chat_template import template_variables

        return template_variables(source)


class IncrementalDetokenizer:
    """Turns a growing token list into text deltas that never split a UTF-8 character.

    vLLM's scheme: only the window ``ids[prefix_offset:]`` is decoded per push, and the
    delta is the text past ``decode(ids[prefix_offset:read_offset])``. Work per token is
    bounded by the window, not the sequence. The window starts on the last few prompt
    tokens so that the first output token decodes in context (SentencePiece decoders strip
    the leading space of a text's first token). A window that ends in an incomplete
    character (U+FFFD) waits for the next token; a genuine U+FFFD inside the output is
    emitted once the text after it is complete.
    """

    CONTEXT_TOKENS = 5

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self._ids: list[int] = list(prompt_ids[-self.CONTEXT_TOKENS :]) if prompt_ids else []
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._chunks: list[str] = []

    def push(self, new_ids: Sequence[int]) -> str:
        self._ids.extend(new_ids)
        prefix_text = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        window_text = self._tok.decode(self._ids[self._prefix_offset :])
        if len(window_text) <= len(prefix_text) or window_text.endswith("\ufffd"):
            return ""
        delta = window_text[len(prefix_text) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        self._chunks.append(delta)
        return delta

    @property
    def text(self) -> str:
        if len(self._chunks) > 1:
            self._chunks = ["".join(self._chunks)]
        return self._chunks[0] if self._chunks else ""


_BULK_MIN = 16  # ``ByteTokenizer.random_token_ids`` draws words in bulk while this many tokens are missing
_BULK_MAX = 1 << 20  # and at most this many words at once (bounds the memory of a whole workload's draw)


class ByteTokenizer(Tokenizer):
    """Token i < 256 is byte i; then BOS, EOS and PAD; any id above is unused vocabulary."""

    def __init__(self, vocab_size: int = 320) -> None:
        if vocab_size < 259:
            raise ValueError(f"byte tokenizer needs vocab_size >= 259, got {vocab_size}")
        self.vocab_size = vocab_size
        self.bos_token_id = 256
        self.eos_token_id = 257
        self.pad_token_id = 258
        self.eos_token_ids = frozenset({257})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [256, *ids] if add_special_tokens else ids

    def random_token_ids(self, n: int, rng: random.Random) -> list[int]:
        """Printable ASCII (32..126), so synthetic prompts read as text: rejection sampling on 7 random
        bits, what ``rng.randrange(32, 127)`` does. ``getrandbits(7)`` is the top 7 bits of one 32-bit
        word of the generator, and ``getrandbits(32 * m)`` is the next m words (least significant
        first), so the words are drawn in bulk: as many as tokens are still missing, which never
        draws a word past the last one the token-by-token loop would take (workloads draw millions)."""
        return _printable_draws(n, rng).tolist()

    def random_token_id_lists(self, lengths: Sequence[int], rng: random.Random) -> list[list[int]]:
        """One bulk draw of all the tokens, cut into the lists: token-by-token draws are consecutive,
        so the lists drawn one after another are the pieces of the draw of their total."""
        flat = _printable_draws(sum(lengths), rng)
        out: list[list[int]] = []
        start = 0
        for n in lengths:
            out.append(flat[start : start + n].tolist())
            start += n
        return out

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if i < 256)
        return data.decode("utf-8", errors="replace")


def _printable_draws(n: int, rng: random.Random) -> np.ndarray:
    """``ByteTokenizer.random_token_ids``: ``n`` tokens in 32..126, 7 bits a try, tries drawn in bulk."""
    parts: list[np.ndarray] = []
    missing = n
    while missing >= _BULK_MIN:
        m = min(missing, _BULK_MAX)
        words = np.frombuffer(rng.getrandbits(32 * m).to_bytes(4 * m, "little"), dtype="<u4")
        bits = words >> 25
        kept = bits[bits < 95]
        parts.append(kept)
        missing -= len(kept)
    bits7 = rng.getrandbits
    tail: list[int] = []
    for _ in range(missing):  # the last few one word at a time
        r = bits7(7)
        while r >= 95:
            r = bits7(7)
        tail.append(r)
    parts.append(np.array(tail, dtype="<u4"))
    return np.concatenate(parts) + 32


def read_json_object(path: str) -> dict[str, Any]:
    """A checkpoint directory's JSON file (``config.json``, ``tokenizer_config.json``...) as a dict;
    ``{}`` when the file is absent or holds no object."""
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}
