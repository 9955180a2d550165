"""Tokenizers: the contract and incremental detokenization (``base``), the byte-level tokenizer of the
stand-in models, Hugging Face ``tokenizers`` from a ``tokenizer.json`` or rebuilt from GGUF metadata,
and chat templates rendered the way ``transformers`` does.

Imports nothing else from forge but ``forge.core``."""
