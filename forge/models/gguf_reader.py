"""A lean GGUF parser: the header, the key/value metadata and the tensor infos, read with
``struct`` from a read-only memory map; the tensor data stays in the map until asked for.

gguf-py's ``GGUFReader`` builds a numpy memmap view per scalar of the metadata (about 3 million for
Gemma-3's 262,144-piece vocabulary: ~14 s); this reads a string array with one ``unpack_from`` and
one slice per element and a numeric array with one ``np.frombuffer`` (Gemma-3's header: ~0.3 s).
Only little-endian files (every GGUF llama.cpp writes by default) are read.

Every problem raises ``GGUFParseError``; a read beyond the end of the file says which bytes it
needed (``the header needs bytes [a, b) ...``, ``tensor 'x' needs bytes [a, b) ...``).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types (gguf spec): scalar struct formats; 8 is STRING, 9 is ARRAY.
_STRING, _ARRAY, _BOOL = 8, 9, 7
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_ARRAY_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype("<u1"),
    1: np.dtype("<i1"),
    2: np.dtype("<u2"),
    3: np.dtype("<i2"),
    4: np.dtype("<u4"),
    5: np.dtype("<i4"),
    6: np.dtype("<f4"),
    7: np.dtype("?"),
    10: np.dtype("<u8"),
    11: np.dtype("<i8"),
    12: np.dtype("<f8"),
}


class GGUFParseError(ValueError):
    """The bytes are not a GGUF this parser reads; ``truncated`` when the file ends too early."""

    def __init__(self, message: str, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``dims`` in GGUF order (innermost first), the raw GGML type number,
    and its bytes ``[begin, end)`` in the file (``end`` is None for a type of unknown size)."""

    name: str
    dims: tuple[int, ...]
    type_id: int
    begin: int
    end: int | None


@dataclass(frozen=True)
class ParsedGGUF:
    """The decoded header: metadata values as Python scalars / lists, tensor infos in file order."""

    version: int
    metadata: dict[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_start: int


class _Cursor:
    """Sequential little-endian reads from a buffer, each checked against its length."""

    def __init__(self, buf: mmap.mmap | bytes) -> None:
        self.buf = buf
        self.size = len(buf)
        self.pos = 0

    def need(self, n: int) -> None:
        if self.pos + n > self.size:
            raise GGUFParseError(
                f"the header needs bytes [{self.pos}, {self.pos + n}) but the file has {self.size}", truncated=True
            )

    def scalar(self, fmt: str) -> Any:
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        self.need(length)
        text = self.buf[self.pos : self.pos + length].decode("utf-8", errors="replace")
        self.pos += length
        return text

    def value(self, type_id: int) -> Any:
        if type_id == _STRING:
            return self.string()
        if type_id == _ARRAY:
            return self.array()
        fmt = _SCALAR_FORMATS.get(type_id)
        if fmt is None:
            raise GGUFParseError(f"unknown metadata value type {type_id} at byte {self.pos}")
        return self.scalar(fmt)

    def array(self) -> list[Any]:
        item_type = self.scalar("<I")
        count = self.scalar("<Q")
        if item_type == _STRING:
            return [self.string() for _ in range(count)]
        if item_type == _ARRAY:
            return [self.array() for _ in range(count)]
        dtype = _ARRAY_DTYPES.get(item_type)
        if dtype is None:
            raise GGUFParseError(f"unknown array item type {item_type} at byte {self.pos}")
        self.need(count * dtype.itemsize)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
        self.pos += count * dtype.itemsize
        return values


def tensor_nbytes(type_id: int, dims: tuple[int, ...]) -> int | None:
    """Bytes of a tensor of GGML type ``type_id`` and ``dims``; None for a type gguf-py does not size."""
    try:
        block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(type_id)]
    except (ValueError, KeyError):
        return None
    return math.prod(dims) * type_size // block_size


def parse(buf: mmap.mmap | bytes) -> ParsedGGUF:
    """The header of the GGUF in ``buf``; tensors whose bytes lie beyond its end are an error."""
    cur = _Cursor(buf)
    cur.need(4)
    if bytes(buf[:4]) != MAGIC:
        raise GGUFParseError(f"bad magic {bytes(buf[:4])!r} (expected {MAGIC!r})")
    cur.pos = 4
    version = cur.scalar("<I")
    if version & 0xFFFF == 0:
        raise GGUFParseError("a big-endian GGUF (only little-endian files are read)")
    if version not in (2, 3):
        raise GGUFParseError(f"GGUF version {version} (supported: 2, 3)")
    n_tensors = cur.scalar("<Q")
    n_kv = cur.scalar("<Q")
    metadata: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar("<I"))
    raw: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(n_tensors):
        name = cur.string()
        n_dims = cur.scalar("<I")
        dims = tuple(cur.scalar("<Q") for _ in range(n_dims))
        raw.append((name, dims, cur.scalar("<I"), cur.scalar("<Q")))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = []
    for name, dims, type_id, offset in raw:
        begin = data_start + offset
        nbytes = tensor_nbytes(type_id, dims)
        end = None if nbytes is None else begin + nbytes
        if end is not None and end > cur.size:
            raise GGUFParseError(
                f"tensor {name!r} needs bytes [{begin}, {end}) but the file has {cur.size}", truncated=True
            )
        tensors.append(TensorInfo(name, dims, type_id, begin, end))
    return ParsedGGUF(version, metadata, tuple(tensors), data_start)
