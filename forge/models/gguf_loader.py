"""Models from GGUF files (llama.cpp's format).

``load_gguf(path)`` looks the file's ``general.architecture`` up in the model registry
(``forge.models.registry``; a family whose ``GGUFFormat.matches`` accepts the file comes first: a
``llama`` file with experts is a Mixtral), reads the config from the metadata with that family's parser,
dequantizes every tensor to float32, renames it to Hugging Face naming and applies the family's
conversion (the Q/K row permutation llama.cpp's converter applies for its interleaved rope, Gemma's
norms stored plus one), builds the tokenizer from the metadata, and hands all of it to the family's
``from_state_dict``. An architecture the registry lacks is a ``GGUFError`` naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from forge.models.decoder import DecoderModel
from forge.models.family import GGUFFormat, ModelFamily, ModelRegistry
from forge.models.fast_weights import apply_weight_format
from forge.models.fetch import gemma3_path, smollm2_path
from forge.models.gguf_file import GGUFError, GGUFFile
from forge.models.gguf_metadata import GLOBAL_NAMES, ROPE_FREQS
from forge.models.registry import MODEL_REGISTRY
from forge.tokenizers.base import Tokenizer
from forge.tokenizers.gguf import GGUFTokenizerError, tokenizer_from_gguf

_LAYER_RE = re.compile(r"blk\.(\d+)\.(.+)")


def family_of(gguf: GGUFFile, registry: ModelRegistry = MODEL_REGISTRY) -> tuple[ModelFamily, GGUFFormat]:
    """The registered family of the file's ``general.architecture`` (a ``GGUFError`` if none)."""
    found = registry.for_gguf(gguf.architecture, gguf)
    if found is None:
        raise GGUFError(
            f"{gguf.path}: architecture {gguf.architecture!r} is not supported "
            f"(supported: {', '.join(registry.gguf_architectures)})"
        )
    return found


def hf_name(gguf_name: str, architecture: str = "llama", registry: ModelRegistry = MODEL_REGISTRY) -> str | None:
    """Hugging Face name of a GGUF tensor, or None if it is not a weight of ``architecture``."""
    found = registry.for_gguf(architecture)
    return GLOBAL_NAMES.get(gguf_name) if found is None else hf_name_in(gguf_name, found[1])


def hf_name_in(gguf_name: str, fmt: GGUFFormat) -> str | None:
    """Hugging Face name of a GGUF tensor, or None if it is not a weight of the family format ``fmt``."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    match = _LAYER_RE.fullmatch(gguf_name)
    suffix = None if match is None else fmt.layer_names.get(match.group(2))
    return None if match is None or suffix is None else f"model.layers.{match.group(1)}.{suffix}"


def config_from_gguf(gguf: GGUFFile, max_position: int | None = None, registry: ModelRegistry = MODEL_REGISTRY) -> Any:
    """The config of the file's family (``LlamaConfig``, ``Gemma3Config``...) from its metadata;
    ``max_position`` caps the context length."""
    return family_of(gguf, registry)[1].config(gguf, gguf.architecture, max_position)


def state_dict_from_gguf(
    gguf: GGUFFile, config: Any, registry: ModelRegistry = MODEL_REGISTRY
) -> dict[str, torch.Tensor]:
    """Every weight dequantized to float32 under its Hugging Face name, converted as its family says."""
    gguf.check_types()
    arch = gguf.architecture
    fmt = family_of(gguf, registry)[1]
    names = {n: hf_name_in(n, fmt) for n in gguf.tensors if n != ROPE_FREQS}
    unknown = [n for n, target in names.items() if target is None]
    if unknown:
        raise GGUFError(f"{gguf.path}: tensors this {arch} loader does not know: {', '.join(unknown[:5])}")
    state: dict[str, torch.Tensor] = {}
    for name, target in names.items():
        if target is not None:
            state[target] = fmt.convert(name, gguf.load(name), config, arch)
    return state


def tokenizer_of(gguf: GGUFFile) -> Tokenizer:
    try:
        return tokenizer_from_gguf(gguf.metadata)
    except GGUFTokenizerError as exc:
        raise GGUFError(f"{gguf.path}: {exc}") from exc


def load_gguf(
    path: str,
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    registry: ModelRegistry = MODEL_REGISTRY,
) -> DecoderModel[Any, Any]:
    """The model with tokenizer in the GGUF at ``path``, of the family its ``general.architecture``
    names in ``registry``.

    ``dtype`` is the compute/KV-cache dtype; ``weights`` the storage format of the linear
    weights (``forge.models.fast_weights``: ``same`` keeps ``dtype``);
    ``max_position`` caps the context length the rope tables are built for (default: the file's).
    """
    return _load(_open_checked(path), dtype, device, weights, max_position, registry)


def _open_checked(path: str) -> GGUFFile:
    """The file at ``path``, its tensor types checked (a clear error for an unsupported one)."""
    gguf = GGUFFile(path)
    gguf.check_types()
    return gguf


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's intra-op threads off for the block, restored after. Loading is a long run of small
    elementwise ops (dequantizing, casting, concatenating): on a shared 2-core machine a second
    thread that is waiting for a core makes each op wait too. Measured on the 2-core EPYC at load
    average ~5: Gemma-3's Q5_0 blocks dequantize 10x faster with one thread than with two."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _load(
    gguf: GGUFFile, dtype: str, device: str, weights: str, max_position: int | None, registry: ModelRegistry
) -> DecoderModel[Any, Any]:
    with one_torch_thread():
        return _load_model(gguf, dtype, device, weights, max_position, registry)


def _load_model(
    gguf: GGUFFile, dtype: str, device: str, weights: str, max_position: int | None, registry: ModelRegistry
) -> DecoderModel[Any, Any]:
    family, fmt = family_of(gguf, registry)
    config = fmt.config(gguf, gguf.architecture, max_position)
    tokenizer = tokenizer_of(gguf)
    state = state_dict_from_gguf(gguf, config, registry)
    try:
        model = family.build(config, state, tokenizer, getattr(torch, dtype), device)
    except KeyError as exc:
        raise GGUFError(f"{gguf.path}: {exc.args[0]}") from exc
    return apply_weight_format(model, weights)


def load_smollm2(
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    cache_dir: str | None = None,
) -> DecoderModel[Any, Any]:
    """SmolLM2-135M-Instruct (Q4_1 GGUF, a ``Llama``), fetched into the forge cache on first use."""
    return load_gguf(str(smollm2_path(cache_dir)), dtype, device, weights, max_position)


def load_gemma3(
    dtype: str = "float32",
    device: str = "cpu",
    weights: str = "same",
    max_position: int | None = None,
    cache_dir: str | None = None,
) -> DecoderModel[Any, Any]:
    """Gemma-3-270M (Q4_K_M GGUF, a ``Gemma3``), fetched into the forge cache on first use."""
    return load_gguf(str(gemma3_path(cache_dir)), dtype, device, weights, max_position)
