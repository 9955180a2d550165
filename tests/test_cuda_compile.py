"""Every CUDA source compiles, for every dtype, with nvcc and (where found) NVRTC.

Runs without a GPU: a syntax or type error in a ``.cu`` file fails CI. nvcc builds the
files as shipped (``-I`` the package) down to sm_80 cubins, so ptxas checks them too;
NVRTC, the compiler CuPy uses at run time, builds the include-expanded text CuPy is
given, with the same options. The NVRTC check needs
libnvrtc (the CUDA toolkit's, the ``nvidia-cuda-nvrtc-cu12`` wheel's, or
``FORGE_NVRTC_LIB``) and is skipped without it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from forge.kernels.cuda.sources import (
    ATTENTION_SOURCES,
    COMMON_OPTIONS,
    DTYPE_CODES,
    KERNEL_DIR,
    SOURCES,
    define_options,
    defines_for,
    expand_source,
)

# Attention builds: (dtype, head_dim, query heads per KV head). Every dtype at SmolLM2-135M's
# shape, then build_tiny's, Llama-3-8B's and the widest supported head, one dtype each.
ATTENTION_BUILDS = [
    (torch.float32, 64, 3),
    (torch.float16, 64, 3),
    (torch.bfloat16, 64, 3),
    (torch.float32, 16, 2),
    (torch.bfloat16, 128, 4),
    (torch.float16, 256, 8),
]
# Quantized KV caches (FORGE_KV: 1 int8, 2 fp8 e4m3, 3 fp8 e5m2), at SmolLM2-135M's attention shape:
# (source, activation dtype, format). Every format's writer and reader, each attention kernel once.
KV_BUILDS = [
    ("cache.cu", torch.float32, 1),
    ("cache.cu", torch.bfloat16, 2),
    ("cache.cu", torch.float16, 3),
    ("paged_attention.cu", torch.float32, 1),
    ("paged_attention.cu", torch.bfloat16, 3),
    ("prefill_attention.cu", torch.float32, 2),
]
NVRTC_HEADERS = {"cuda_fp16.h", "cuda_bf16.h"}


def _builds() -> list[tuple[str, dict[str, int]]]:
    builds = []
    for source in SOURCES:
        if source in ATTENTION_SOURCES:
            builds += [(source, defines_for(dt, head_dim=d, gqa=g)) for dt, d, g in ATTENTION_BUILDS]
        else:
            builds += [(source, defines_for(dtype)) for dtype in DTYPE_CODES]
    for source, dt, kv in KV_BUILDS:
        shape = {"head_dim": 64, "gqa": 3} if source in ATTENTION_SOURCES else {}
        builds.append((source, defines_for(dt, kv=kv, **shape)))
    return builds


def _label(build: tuple[str, dict[str, int]]) -> str:
    return build[0] + " " + " ".join(f"{k}={v}" for k, v in sorted(build[1].items()))


def test_sources_listed_and_only_nvrtc_headers() -> None:
    on_disk = {p.name for p in KERNEL_DIR.glob("*.cu")}
    assert on_disk == set(SOURCES), "every .cu file must be listed in sources.SOURCES (and vice versa)"
    for path in [*KERNEL_DIR.glob("*.cu"), *KERNEL_DIR.glob("*.cuh")]:
        for system_header in re.findall(r"#\s*include\s*<([^>]+)>", path.read_text()):
            assert system_header in NVRTC_HEADERS, f"{path.name} includes <{system_header}>, which NVRTC lacks"
        for local in re.findall(r'#\s*include\s*"([^"]+)"', path.read_text()):
            assert (KERNEL_DIR / local).is_file(), f"{path.name} includes missing {local}"


def test_expanded_sources_are_self_contained() -> None:
    for source in SOURCES:
        text = expand_source(source)
        assert '#include "' not in text
        assert "pragma once" not in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_nvcc_compiles_every_source(tmp_path: Path) -> None:
    def compile_one(i: int, build: tuple[str, dict[str, int]]) -> str | None:
        source, defines = build
        cmd = [
            "nvcc",
            "--cubin",
            *COMMON_OPTIONS,
            "-arch=sm_80",
            "--Werror",
            "all-warnings",
            f"-I{KERNEL_DIR}",
            *define_options(defines),
            "-o",
            str(tmp_path / f"{i}.cubin"),
            str(KERNEL_DIR / source),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        return None if proc.returncode == 0 else f"{_label(build)}:\n{proc.stdout}{proc.stderr}"

    builds = _builds()
    with ThreadPoolExecutor(max_workers=4) as pool:  # nvcc mostly waits on its sub-tools
        failures = [f for f in pool.map(compile_one, range(len(builds)), builds) if f]
    assert not failures, "\n\n".join(failures)


def _find_nvrtc() -> str | None:
    candidates = [os.environ.get("FORGE_NVRTC_LIB", "")]
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so*")))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cu13", "lib", "libnvrtc.so*")))
    candidates += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    candidates.append(ctypes.util.find_library("nvrtc") or "")
    for path in candidates:
        if path and "builtins" not in path and "alt" not in os.path.basename(path):
            try:
                ctypes.CDLL(path)
                return path
            except OSError:
                continue
    return None


def _nvrtc_compile(lib: ctypes.CDLL, source: str, name: str, options: list[str]) -> tuple[int, str]:
    prog = ctypes.c_void_p()
    rc = lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    assert rc == 0, f"nvrtcCreateProgram failed ({rc})"
    opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    rc = lib.nvrtcCompileProgram(prog, len(options), opts)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return rc, log.value.decode(errors="replace")


def _cuda_include_dirs() -> list[str]:
    """Where cuda_fp16.h lives: a CUDA toolkit, or the nvidia-cuda-runtime-cu12 wheel (dev
    extras, Linux). NVRTC 12 does not build it in; CuPy adds its CUDA include directory the
    same way at run time."""
    roots = [os.environ.get("CUDA_PATH", ""), os.environ.get("CUDA_HOME", "")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(os.path.realpath(nvcc)).parent.parent))
    roots.append("/usr/local/cuda")
    roots += [os.path.join(site, "nvidia", "cuda_runtime") for site in sys.path]  # the nvidia-cuda-runtime-cu12 wheel
    return [f"{r}/include" for r in roots if r and (Path(r) / "include" / "cuda_fp16.h").is_file()][:1]


@pytest.mark.skipif(_find_nvrtc() is None, reason="libnvrtc not found (set FORGE_NVRTC_LIB)")
def test_nvrtc_compiles_every_source() -> None:
    lib = ctypes.CDLL(_find_nvrtc() or "")
    includes = [f"-I{d}" for d in _cuda_include_dirs()]
    failures = []
    for build in _builds():
        source, defines = build
        options = [*COMMON_OPTIONS, "-arch=compute_80", *includes, *define_options(defines)]
        rc, log = _nvrtc_compile(lib, expand_source(source), source, options)
        if rc != 0:
            failures.append(f"{_label(build)}:\n{log}")
    assert not failures, "\n\n".join(failures)


def test_dtype_codes_cover_backend_dtypes() -> None:
    assert set(DTYPE_CODES) == {torch.float32, torch.float16, torch.bfloat16}
