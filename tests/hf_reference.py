"""transformers loading a GGUF file: the reference the real-model parity tests compare against."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def load_hf_gguf(gguf_path: str) -> tuple[Any, Any]:
    """``(tokenizer, float32 model in eval mode)`` from transformers for ``gguf_path`` (skips the test
    when transformers or accelerate, which it needs to read GGUF, is missing)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    directory, name = gguf_path.rsplit("/", 1)
    tok = transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)
    lm = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    return tok, lm.eval()
