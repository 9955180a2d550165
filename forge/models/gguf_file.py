"""Opening a GGUF file: metadata as plain Python values, tensors as dequantized float32.

Every failure (missing file, not a GGUF, truncated data, a tensor type without a
dequantizer, non-finite weights) raises ``GGUFError`` whose message starts with the file's path.
Each tensor's byte range is checked against the file's size before it is mapped, and each
dequantized tensor is checked for NaN/inf when it is loaded.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType

from forge.models.gguf_quants import SUPPORTED_TYPES, dequantize
from forge.models.gguf_reader import GGUFParseError, TensorInfo, parse


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the path and the reason in the message."""


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped; tensors decode on demand)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such GGUF file")
        try:
            with open(self.path, "rb") as handle:
                self._map = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
            parsed = parse(self._map)
        except GGUFParseError as exc:
            reason = f"truncated: {exc}" if exc.truncated else f"not a readable GGUF file ({exc})"
            raise GGUFError(f"{self.path}: {reason}") from exc
        except (OSError, ValueError, UnicodeError) as exc:  # an empty file cannot be mapped
            raise GGUFError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        self.metadata: dict[str, Any] = parsed.metadata
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in parsed.tensors}

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: metadata lacks general.architecture")
        return arch

    def require(self, key: str) -> Any:
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: metadata lacks required key {key!r}")
        return self.metadata[key]

    def tensor_type(self, name: str) -> GGMLQuantizationType:
        type_id = self.tensors[name].type_id
        try:
            return GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFError(f"{self.path}: tensor {name!r} has unknown GGML type {type_id}") from None

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape in torch order (outermost first): ``[out, in]`` for a linear weight."""
        return tuple(reversed(self.tensors[name].dims))

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes of tensor ``name``: a read-only view of the memory map."""
        info = self.tensors[name]
        if info.end is None:
            raise GGUFError(f"{self.path}: tensor {name!r} has a type of unknown size ({info.type_id})")
        return np.frombuffer(self._map, dtype=np.uint8, count=info.end - info.begin, offset=info.begin)

    def check_types(self) -> None:
        """Fail early, naming every tensor whose type has no dequantizer."""
        bad = [f"{n} ({self.tensor_type(n).name})" for n in self.tensors if self.tensor_type(n) not in SUPPORTED_TYPES]
        if bad:
            supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
            raise GGUFError(
                f"{self.path}: unsupported tensor types: {', '.join(bad[:5])}"
                f"{' ...' if len(bad) > 5 else ''}; supported: {supported}"
            )

    def load(self, name: str) -> torch.Tensor:
        """Tensor ``name`` dequantized to float32 in torch order; a NaN or inf in it (a corrupt
        file) is a ``GGUFError`` naming the tensor."""
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor named {name!r}")
        qtype = self.tensor_type(name)
        try:
            tensor = dequantize(self.raw(name), qtype, self.tensor_shape(name))
        except (NotImplementedError, ValueError) as exc:
            raise GGUFError(f"{self.path}: tensor {name!r}: {exc}") from exc
        # A finite sum proves every element finite (NaN and inf propagate) at a twentieth of the
        # cost of isfinite().all() on CPU; only a non-finite sum (or an overflowing one) looks closer.
        if not bool(torch.isfinite(tensor.sum())) and not bool(torch.isfinite(tensor).all()):
            raise GGUFError(f"{self.path}: tensor {name!r} holds non-finite values (NaN or inf): the file is corrupt")
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)
