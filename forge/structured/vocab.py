"""The bytes each token id stands for, as grammar engines need them.

- a tokenizer with a ``token_bytes(id)`` method: that;
- the byte tokenizer of the stand-ins (``ByteTokenizer``): token i < 256 is byte i;
- a Hugging Face tokenizer (``HFTokenizer``): byte-level BPE pieces (GPT-2 alphabet) are mapped
  back to bytes; SentencePiece pieces map ``▁`` to a space and ``<0xNN>`` to the byte;
- anything else: ``decode([id])`` encoded as UTF-8.

Special tokens (BOS, EOS, ...) and ids with no text get ``None``: grammars never emit them,
except EOS, which the backends allow in accepting states.
"""

from __future__ import annotations

import re
from functools import lru_cache

from forge.structured.base import GrammarError
from forge.tokenizers.base import ByteTokenizer, Tokenizer

_HEX_BYTE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


@lru_cache(maxsize=1)
def _gpt2_unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's ``bytes_to_unicode`` table."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _hf_piece_bytes(piece: str, byte_level: bool) -> bytes | None:
    if byte_level:
        table = _gpt2_unicode_to_byte()
        if all(ch in table for ch in piece):
            return bytes(table[ch] for ch in piece)
        return None
    m = _HEX_BYTE.match(piece)
    if m:
        return bytes([int(m.group(1), 16)])
    return piece.replace("▁", " ").encode("utf-8")


def token_bytes(tokenizer: Tokenizer, vocab_size: int | None = None) -> list[bytes | None]:
    """``out[i]``: the bytes of token ``i`` (None for special or empty tokens)."""
    n = vocab_size or tokenizer.vocab_size
    special = tokenizer.special_token_ids()
    custom = getattr(tokenizer, "token_bytes", None)
    out: list[bytes | None] = []
    if callable(custom):
        out = [None if i in special else custom(i) for i in range(n)]
    elif isinstance(tokenizer, ByteTokenizer):
        out = [bytes([i]) if i < 256 else None for i in range(n)]
    elif hasattr(tokenizer, "backend") and hasattr(tokenizer.backend, "id_to_token"):
        backend = tokenizer.backend
        byte_level = "ByteLevel" in str(getattr(backend, "decoder", "")) or "ByteLevel" in str(
            getattr(backend, "pre_tokenizer", "")
        )
        added = {int(i) for i in getattr(backend, "get_added_tokens_decoder", dict)()}
        for i in range(n):
            piece = backend.id_to_token(i)
            if piece is None or i in special or i in added:
                out.append(None)
            else:
                out.append(_hf_piece_bytes(piece, byte_level))
    else:
        out = [None if i in special else tokenizer.decode([i]).encode("utf-8") for i in range(n)]
    return [b if b else None for b in out]


def grammar_vocab(tokenizer: Tokenizer) -> tuple[list[bytes | None], frozenset[int]]:
    """Each token's bytes and the EOS ids, for compiling grammars against ``tokenizer``."""
    if not tokenizer.eos_token_ids:
        raise GrammarError("structured output needs a tokenizer with an EOS token")
    return token_bytes(tokenizer, tokenizer.vocab_size), frozenset(tokenizer.eos_token_ids)
