"""What forge knows about a model family, and the registry the loaders dispatch through.

A family is one module (``forge.models.llama``, ``forge.models.gemma3``) holding its config, its
``DecoderModel`` subclass and a ``ModelFamily`` describing how each checkpoint format maps onto
them; ``forge.models.registry`` lists the families. The GGUF loader looks a file's
``general.architecture`` up here, the SafeTensors loader a ``config.json``'s ``model_type``; neither
names a family.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from forge.models.decoder import DecoderModel
from forge.models.gguf_file import GGUFFile
from forge.tokenizers.base import Tokenizer


class CheckpointError(ValueError):
    """An unusable Hugging Face checkpoint directory; the message names it and the problem."""


def keep_tensor(name: str, tensor: torch.Tensor, config: Any, architecture: str) -> torch.Tensor:
    """The default GGUF tensor conversion: none."""
    return tensor


@dataclass(frozen=True)
class GGUFFormat:
    """How a family reads llama.cpp's GGUF files.

    ``config(gguf, architecture, max_position)`` parses the metadata (raising ``GGUFError``);
    ``layer_names`` maps ``blk.N.<name>`` to ``model.layers.N.<Hugging Face name>`` (the tensors
    outside the layers are the same for every family: ``gguf_metadata.GLOBAL_NAMES``);
    ``convert(gguf_name, tensor, config, architecture)`` undoes what llama.cpp's converter did to a
    tensor (a Q/K row permutation, a norm stored plus one).

    ``matches`` None: the family reads every file of its ``architectures``. A predicate makes it a
    variant of a shared architecture: it reads the files the predicate accepts, ahead of that
    architecture's own family (llama.cpp writes a Mixtral as ``llama`` with ``llama.expert_count``)."""

    architectures: tuple[str, ...]
    config: Callable[[GGUFFile, str, int | None], Any]
    layer_names: Mapping[str, str]
    convert: Callable[[str, torch.Tensor, Any, str], torch.Tensor] = keep_tensor
    matches: Callable[[GGUFFile], bool] | None = None


@dataclass(frozen=True)
class HFFormat:
    """How a family reads a Hugging Face directory: ``config(config_json, directory, max_position)``
    parses ``config.json`` (raising ``CheckpointError``) for the ``model_types`` it accepts."""

    model_types: tuple[str, ...]
    config: Callable[[dict[str, Any], str, int | None], Any]


ModelBuilder = Callable[[Any, dict[str, torch.Tensor], Tokenizer, torch.dtype, str], DecoderModel[Any, Any]]


@dataclass(frozen=True)
class ModelFamily:
    """A family: ``build(config, hf_named_state, tokenizer, dtype, device)`` makes the model (a
    ``DecoderModel.from_state_dict``); ``gguf`` / ``hf`` say how each checkpoint format gives its config
    and tensors (None: that format is not read for this family)."""

    name: str
    build: ModelBuilder
    gguf: GGUFFormat | None = None
    hf: HFFormat | None = None


@dataclass(frozen=True)
class ModelRegistry:
    """Model families by the names checkpoints give their architecture. Immutable: ``with_family``
    returns a new registry."""

    families: tuple[ModelFamily, ...] = ()
    _by_gguf: Mapping[str, ModelFamily] = field(init=False, repr=False, compare=False)
    _gguf_variants: tuple[ModelFamily, ...] = field(init=False, repr=False, compare=False)
    _by_hf: Mapping[str, ModelFamily] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_gguf: dict[str, ModelFamily] = {}
        by_hf: dict[str, ModelFamily] = {}
        for family in self.families:
            variant = family.gguf is not None and family.gguf.matches is not None
            for table, names in (
                (by_gguf, family.gguf.architectures if family.gguf and not variant else ()),
                (by_hf, family.hf.model_types if family.hf else ()),
            ):
                for name in names:
                    if name in table:
                        raise ValueError(
                            f"architecture {name!r} is registered by {table[name].name!r} and {family.name!r}"
                        )
                    table[name] = family
        object.__setattr__(self, "_by_gguf", by_gguf)
        object.__setattr__(
            self, "_gguf_variants", tuple(f for f in self.families if f.gguf is not None and f.gguf.matches is not None)
        )
        object.__setattr__(self, "_by_hf", by_hf)

    def with_family(self, family: ModelFamily) -> ModelRegistry:
        """This registry plus ``family`` (a ``ValueError`` if it claims an architecture already taken)."""
        return dataclasses.replace(self, families=(*self.families, family))

    @property
    def gguf_architectures(self) -> tuple[str, ...]:
        variants = (a for f in self._gguf_variants if f.gguf for a in f.gguf.architectures)
        return tuple(dict.fromkeys((*self._by_gguf, *variants)))

    @property
    def hf_model_types(self) -> tuple[str, ...]:
        return tuple(self._by_hf)

    def for_gguf(self, architecture: str, gguf: GGUFFile | None = None) -> tuple[ModelFamily, GGUFFormat] | None:
        """The family of GGUF ``general.architecture`` ``architecture`` and its GGUF format, or None.
        Given the file ``gguf``, the first registered variant (``GGUFFormat.matches``) that accepts it
        comes first."""
        if gguf is not None:
            for variant in self._gguf_variants:
                fmt = variant.gguf
                if fmt and fmt.matches and architecture in fmt.architectures and fmt.matches(gguf):
                    return variant, fmt
        family = self._by_gguf.get(architecture)
        return None if family is None or family.gguf is None else (family, family.gguf)

    def for_hf(self, model_type: str) -> tuple[ModelFamily, HFFormat] | None:
        """The family of ``config.json`` ``model_type`` and its Hugging Face format, or None."""
        family = self._by_hf.get(model_type)
        return None if family is None or family.hf is None else (family, family.hf)
