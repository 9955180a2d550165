"""Opening a GGUF file: metadata as plain Python values, tensors as dequantized float32.

Every failure (missing file, not a GGUF, truncated data, a tensor type without a
dequantizer) raises ``GGUFError`` whose message starts with the file's path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField, ReaderTensor

from forge.models.gguf_quants import SUPPORTED_TYPES, dequantize


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the path and the reason in the message."""


def _field_value(field: ReaderField) -> Any:
    """A metadata field as str / int / float / bool, or a list of those."""
    if not field.types:
        return None
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        inner = field.types[-1]
        if inner == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        if not field.data:
            return []
        # Numeric arrays: the parts are one-element numpy arrays; concatenate once.
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    if kind == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    value = field.parts[field.data[0]][0]
    return bool(value) if kind == GGUFValueType.BOOL else value.item()


class GGUFFile:
    """A GGUF file opened for reading (memory-mapped; tensors decode on demand)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise GGUFError(f"{self.path}: no such GGUF file")
        try:
            self._reader = GGUFReader(self.path, "r")
        except Exception as exc:  # numpy/struct errors on garbage or truncated headers
            raise GGUFError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        self.metadata: dict[str, Any] = {
            name: _field_value(field) for name, field in self._reader.fields.items() if not name.startswith("GGUF.")
        }
        self.tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}
        self._check_sizes()

    def _check_sizes(self) -> None:
        file_size = os.path.getsize(self.path)
        for t in self._reader.tensors:
            end = t.data_offset + t.n_bytes
            if end > file_size or t.data.nbytes != t.n_bytes:
                raise GGUFError(
                    f"{self.path}: truncated: tensor {t.name!r} needs bytes up to {end}, file has {file_size}"
                )

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
        return GGMLQuantizationType(self.tensors[name].tensor_type)

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        """Shape in torch order (outermost first): ``[out, in]`` for a linear weight."""
        return tuple(int(n) for n in reversed(self.tensors[name].shape.tolist()))

    def check_types(self) -> None:
        """Fail early, naming every tensor whose type has no dequantizer."""
        bad = [f"{n} ({self.tensor_type(n).name})" for n in self.tensors if self.tensor_type(n) not in SUPPORTED_TYPES]
        if bad:
            supported = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
            raise GGUFError(f"{self.path}: unsupported tensor types: {', '.join(bad[:5])}"
                            f"{' ...' if len(bad) > 5 else ''}; supported: {supported}")

    def load(self, name: str) -> torch.Tensor:
        """Tensor ``name`` dequantized to float32 in torch order."""
        if name not in self.tensors:
            raise GGUFError(f"{self.path}: no tensor named {name!r}")
        qtype = self.tensor_type(name)
        try:
            return dequantize(self.tensors[name].data, qtype, self.tensor_shape(name))
        except (NotImplementedError, ValueError) as exc:
            raise GGUFError(f"{self.path}: tensor {name!r}: {exc}") from exc

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)
