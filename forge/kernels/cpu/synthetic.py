"""The synthetic model's decode chain in C (``synthetic.c``), for ``forge.models.synthetic``: the same
tokens and KV writes as its Python chain, reading the rows' lists and building the token lists
itself (``ctypes.PyDLL``, compiled against this Python's headers). Imports no torch; the library is built on
first use (``forge.kernels.cpu.build``) and used only if its tuple hash equals this Python's ``hash``
on a set of probes (CPython's hash of ints and tuples is deterministic, not part of the language)."""

from __future__ import annotations

import ctypes
import sysconfig
from array import array
from functools import cache
from pathlib import Path

from forge.kernels.cpu.build import NativeKernelsUnavailable, shared_library

SOURCE = Path(__file__).with_name("synthetic.c")
MAX_ORDER = 64  # synthetic.c's context buffer
PROBES = [(0, -1, 5, 40), (7, 2**40, -1, 126), (-1, -2, 2**61 - 1, 2**61, -(2**63)), (3,), (2**63 - 1, 2**62, -5)]


@cache
def library() -> ctypes.PyDLL | None:
    """The chain's library, or None where it does not build (no C compiler, no Python headers) or
    its hash is not this Python's. Loaded with ``PyDLL``: its functions run with the GIL."""
    include = sysconfig.get_paths()["include"]
    try:
        flags = ("-O2", "-fPIC", "-std=c11", f"-I{include}")
        lib = ctypes.PyDLL(str(shared_library("forge_synthetic", {SOURCE: ()}, flags, ("-shared",))))
    except (NativeKernelsUnavailable, OSError):
        return None
    i64, ptr, obj = ctypes.c_int64, ctypes.c_void_p, ctypes.py_object
    lib.forge_synthetic_tuple_hash.argtypes = [ptr, i64]
    lib.forge_synthetic_tuple_hash.restype = i64
    fn = lib.forge_synthetic_decode_rows
    fn.argtypes = [ptr, ptr, i64, i64, i64, i64, ctypes.c_uint64, i64, i64, obj, obj, obj, obj]
    fn.restype = obj
    lib.forge_synthetic_write.argtypes = [ptr, ptr, i64, i64, i64, obj, obj]
    lib.forge_synthetic_write.restype = obj
    for probe in PROBES:
        values = array("q", probe)
        if lib.forge_synthetic_tuple_hash(values.buffer_info()[0], len(probe)) != hash(probe):
            return None
    return lib


def decode_rows(
    kv: tuple[int, int, int],
    block_size: int,
    order: int,
    seed: int,
    threshold: int,
    first: int,
    span: int,
    rows: tuple[list[int], list[int], list[int], list[list[int]]],
) -> list[list[int]] | None:
    """The chain over ``rows`` = (starts, tokens, num_steps, block tables): each row's sampled tokens,
    its tokens' KV written into the cache ``kv`` = (K address, V address, slots: int64 each); None
    where the library is unavailable (or ``order`` / ``seed`` out of its range): run the Python chain."""
    lib = library()
    if lib is None or not 1 <= order <= MAX_ORDER or not -(2**63) <= seed < 2**63:
        return None
    sampled: list[list[int]] = lib.forge_synthetic_decode_rows(
        *kv, block_size, order, seed, threshold, first, span, *rows
    )
    return sampled


def write_tokens(kv: tuple[int, int, int], block_size: int, start: int, token_ids: list[int], table: list[int]) -> bool:
    """Write ``token_ids`` at positions ``start``.. of the cache ``kv`` (as ``decode_rows``) through the
    block ``table``; False (nothing written) where the library is unavailable."""
    lib = library()
    if lib is None:
        return False
    lib.forge_synthetic_write(*kv, block_size, start, token_ids, table)
    return True
