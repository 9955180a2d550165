"""The CUDA C sources shipped in this package and the macros each is compiled with.

Every source includes ``common.cuh`` and is built once per element type
(``-DFORGE_DTYPE``); the attention sources are also specialised on head_dim and on the
number of query heads per KV head. Both the run-time compiler (NVRTC through CuPy) and CI's
compile check (nvcc, and NVRTC where available) read this module.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

KERNEL_DIR = Path(__file__).resolve().parent

SOURCES: tuple[str, ...] = (
    "cache.cu",
    "norm.cu",
    "rope.cu",
    "activation.cu",
    "sampling.cu",
    "paged_attention.cu",
    "prefill_attention.cu",
    "quant.cu",
)
ATTENTION_SOURCES: frozenset[str] = frozenset({"paged_attention.cu", "prefill_attention.cu"})

DTYPE_CODES: dict[torch.dtype, int] = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

# Options understood by both nvcc and NVRTC.
COMMON_OPTIONS: tuple[str, ...] = ("--std=c++17",)

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def dtype_code(dtype: torch.dtype) -> int:
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        supported = ", ".join(str(d).removeprefix("torch.") for d in DTYPE_CODES)
        raise ValueError(f"the CUDA kernels support {supported}; got {dtype}") from None


def defines_for(dtype: torch.dtype, **extra: int) -> dict[str, int]:
    """Macro values for one build: ``FORGE_DTYPE`` plus e.g. ``FORGE_HEAD_DIM``/``FORGE_GQA``."""
    return {"FORGE_DTYPE": dtype_code(dtype), **{f"FORGE_{k.upper()}": v for k, v in extra.items()}}


def define_options(defines: dict[str, int]) -> tuple[str, ...]:
    return tuple(f"-D{name}={value}" for name, value in sorted(defines.items()))


def expand_source(name: str) -> str:
    """The source with this package's ``#include "..."`` files inlined (each once).

    CuPy's on-disk kernel cache keys on the source text it is given, so inlining makes an
    edit to a header recompile every kernel that uses it.
    """
    seen: set[str] = set()

    def expand(file: str) -> list[str]:
        if file in seen:
            return []
        seen.add(file)
        lines: list[str] = []
        for line in (KERNEL_DIR / file).read_text().splitlines():
            include = _INCLUDE.match(line)
            if include and (KERNEL_DIR / include.group(1)).is_file():
                lines.extend(expand(include.group(1)))
            elif not _PRAGMA_ONCE.match(line):
                lines.append(line)
        return lines

    return "\n".join(expand(name)) + "\n"
