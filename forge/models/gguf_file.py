"""Opening a GGUF file: metadata as plain Python values, tensors as dequantized float32.

Every failure (missing file, not a GGUF, truncated data, a tensor type without a
dequantizer, non-finite weights) raises ``GGUFError`` whose message starts with the file's path.
Each tensor's byte range is checked against the file's size before it is mapped, and each
dequantized tensor is checked for NaN/inf when it is loaded.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType, ReaderField, ReaderTensor

from forge.models.gguf_quants import SUPPORTED_TYPES, dequantize


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the path and the reason in the message."""


class _Truncated(Exception):
    """Raised inside the reader; ``GGUFFile`` turns it into a ``GGUFError`` with the path."""


class _RangeCheckedReader(GGUFReader):
    """``GGUFReader`` that checks, before mapping anything, that the bytes it is about to read
    lie within the file: a truncated file is reported as such, not as a numpy reshape error."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = offset + int(count) * np.dtype(dtype).itemsize
        if end > len(self.data):
            raise _Truncated(f"the header needs bytes [{offset}, {end}) but the file has {len(self.data)}")
        return super()._get(offset, dtype, count, override_order)

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset = field.parts
            try:
                block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(int(raw_dtype[0]))]
            except (ValueError, KeyError):
                continue  # the reader names the unknown type itself
            begin = int(start_offs) + int(offset[0])
            end = begin + math.prod(int(d) for d in dims) * type_size // block_size
            if end > len(self.data):
                name = bytes(name_data).decode("utf-8", errors="replace")
                raise _Truncated(f"tensor {name!r} needs bytes [{begin}, {end}) but the file has {len(self.data)}")
        super()._build_tensors(start_offs, fields)


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
            self._reader = _RangeCheckedReader(self.path, "r")
        except _Truncated as exc:
            raise GGUFError(f"{self.path}: truncated: {exc}") from exc
        except Exception as exc:  # numpy/struct errors on garbage or truncated headers
            raise GGUFError(f"{self.path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        self.metadata: dict[str, Any] = {
            name: _field_value(field) for name, field in self._reader.fields.items() if not name.startswith("GGUF.")
        }
        self.tensors: dict[str, ReaderTensor] = {t.name: t for t in self._reader.tensors}

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
            tensor = dequantize(self.tensors[name].data, qtype, self.tensor_shape(name))
        except (NotImplementedError, ValueError) as exc:
            raise GGUFError(f"{self.path}: tensor {name!r}: {exc}") from exc
        # A finite sum proves every element finite (NaN and inf propagate) at a twentieth of the
        # cost of isfinite().all() on CPU; only a non-finite sum (or an overflowing one) looks closer.
        if not bool(torch.isfinite(tensor.sum())) and not bool(torch.isfinite(tensor).all()):
            raise GGUFError(f"{self.path}: tensor {name!r} holds non-finite values (NaN or inf): the file is corrupt")
        return tensor

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)
