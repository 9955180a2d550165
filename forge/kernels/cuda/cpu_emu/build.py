"""Compile a CUDA C source against ``cuda_cpu.h`` with the machine's C++ compiler; load it with ctypes.

The source is the one CuPy would get (``expand_source``), compiled with its ``-D`` options.
Two things are added, neither touching a kernel: each ``extern __shared__ T name[];`` becomes
``T* const name = forge_emu::dynamic_shared<T>();`` on the same line (an extern array whose
address is chosen per launch has no C++ spelling), and after the source, per ``__global__``
function, three ``extern "C"`` entry points: launch, parameter sizes and kinds, and the
``__launch_bounds__`` thread limit. Libraries are cached in ``<cache>/kernels/cuda_cpu/`` by a
hash of everything that goes into them (``$FORGE_CACHE_DIR``, as for the CPU backend's C
kernels); ``$CXX`` picks the compiler (default ``g++``).
"""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from forge.core.cache import cache_dir

HERE = Path(__file__).resolve().parent
HEADERS = ("cuda_cpu.h", "cuda_cpu_check.h", "cuda_cpu_intrinsics.h", "cuda_fp16.h", "cuda_bf16.h")
CXX_FLAGS = (
    "-std=gnu++17",  # GNU: `, ##__VA_ARGS__` for __syncwarp(); also contracts a * b + c into an FMA, as NVRTC does
    "-O1",
    "-fPIC",
    # Every load and store of kernel code calls a __tsan_* hook; cuda_cpu_check.h defines them
    # (the thread sanitizer's run-time library is never linked). Line tables name the lines.
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "-g1",
    "-fno-strict-aliasing",
    "-fno-threadsafe-statics",
    # Each module keeps its own runtime: no symbol (inline variables, static locals) is unified
    # with another loaded module's, which may be built differently (ucontext).
    "-fvisibility=hidden",
    "-fno-gnu-unique",
    "-U_FORTIFY_SOURCE",
    "-w",
)

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.S)
_KERNEL = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"(?:__launch_bounds__\s*\((?P<bounds>(?:[^()]|\([^()]*\))*)\)\s+)?"
    r"(?P<name>\w+)\s*\((?P<params>[^)]*)\)"
)
DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?P<type>\w[\w\s]*?)\s+(?P<name>\w+)\s*\[\s*\]\s*;")
_STATIC_SHARED = re.compile(
    r"(?<!extern )__shared__\s+(?P<type>\w[\w\s]*?)\s+(?P<name>\w+)\s*(?P<dims>(?:\[[^\]]+\]\s*)*);"
)
_PARAM_NAME = re.compile(r"(\w+)\s*$")
PADDED_PREFIX = "forge_emu_padded_"
GUARD_BYTES = 16  # cuda_cpu.h's Padded


class EmulatorBuildError(RuntimeError):
    """The source did not compile for the CPU layer; the message holds the compiler's output."""


@dataclass(frozen=True)
class KernelSignature:
    name: str
    param_names: tuple[str, ...]
    launch_bounds: str | None  # the C expression, evaluated in the compiled source


def kernel_signatures(source: str) -> list[KernelSignature]:
    """Every ``extern "C" __global__`` function of ``source``, in order."""
    code = _COMMENT.sub(" ", source)
    out = []
    for m in _KERNEL.finditer(code):
        params = [p.strip() for p in m.group("params").split(",") if p.strip()]
        names = tuple(n.group(1) if (n := _PARAM_NAME.search(p)) else p for p in params)
        bounds = m.group("bounds")
        out.append(KernelSignature(m.group("name"), names, bounds.strip() if bounds else None))
    return out


def dynamic_shared_names(source: str) -> dict[str, tuple[str, ...]]:
    """Per kernel, the ``extern __shared__`` arrays declared between its signature and the next kernel's."""
    code = _COMMENT.sub(lambda m: " " * len(m.group(0)), source)
    starts = [(m.start(), m.group("name")) for m in _KERNEL.finditer(code)]
    out = {}
    for i, (start, name) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(code)
        out[name] = tuple(m.group("name") for m in DYNAMIC_SHARED.finditer(code, start, end))
    return out


def rewrite_dynamic_shared(source: str) -> str:
    """``extern __shared__ T name[];`` as a pointer to the launch's dynamic shared memory (same line)."""
    return DYNAMIC_SHARED.sub(
        lambda m: f"{m.group('type')}* const {m.group('name')} = ::forge_emu::dynamic_shared<{m.group('type')}>();",
        source,
    )


def rewrite_static_shared(source: str) -> str:
    """``__shared__ T name[N];`` as a ``Padded`` variable (16 guard bytes after it) and a reference
    ``name`` to its value (same line), so that one past the array is outside every variable."""
    return _STATIC_SHARED.sub(
        lambda m: (
            f"__shared__ ::forge_emu::Padded<{m.group('type')}{m.group('dims').replace(' ', '')}> "
            f"{PADDED_PREFIX}{m.group('name')}; auto& {m.group('name')} = {PADDED_PREFIX}{m.group('name')}.value;"
        ),
        source,
    )


def entry_points(kernels: list[KernelSignature]) -> str:
    lines = [
        "",
        "// ---- generated by forge.kernels.cuda.cpu_emu.build ----",
        '#define FORGE_EMU_EXPORT extern "C" __attribute__((visibility("default")))',
        "FORGE_EMU_EXPORT size_t forge_emu_static_shared() { return ::forge_emu::static_shared_bytes(); }",
        "FORGE_EMU_EXPORT unsigned long forge_emu_static_shared_offset() { using namespace ::forge_emu; "
        "return __start_forge_emu_shared ? pc_offset(__start_forge_emu_shared) : 0; }",
    ]
    for k in kernels:
        bounds = f"(int)({k.launch_bounds})" if k.launch_bounds else "1024"
        lines += [
            f"FORGE_EMU_EXPORT int forge_emu_launch__{k.name}"
            "(const ::forge_emu::Launch* c, void** a, char* e, size_t n) "
            f"{{ return ::forge_emu::launch(&{k.name}, c, a, e, n); }}",
            f"FORGE_EMU_EXPORT int forge_emu_params__{k.name}(int* s, char* k, int cap) "
            f"{{ return ::forge_emu::describe(&{k.name}, s, k, cap); }}",
            f"FORGE_EMU_EXPORT int forge_emu_max_threads__{k.name}() {{ return {bounds}; }}",
        ]
    return "\n".join(lines) + "\n"


def translation_unit(source: str) -> str:
    """What the C++ compiler sees (after the force-included header): line numbers are the source's."""
    return rewrite_static_shared(rewrite_dynamic_shared(source)) + entry_points(kernel_signatures(source))


def _compiler() -> str:
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise EmulatorBuildError(f"no C++ compiler: {cxx!r} is not on PATH (install g++, or set $CXX)")
    return cxx


@cache
def _compiler_version(cxx: str) -> str:
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def compiler_flags(options: tuple[str, ...], extra_flags: tuple[str, ...] = ()) -> list[str]:
    """g++ flags for CuPy/NVRTC ``options``: ``-D``/``-U`` are kept, the rest (``--std``, ``-arch``,
    fast-math switches) have no CPU meaning and are dropped."""
    kept = [o for o in options if o.startswith(("-D", "-U"))]
    fma = ["-mfma", "-fexpensive-optimizations"] if has_fma() else []  # -O1 contracts only with the latter
    return [*CXX_FLAGS, *fma, *extra_flags, f"-I{HERE}", "-include", str(HERE / "cuda_cpu.h"), *kept]


@cache
def has_fma() -> bool:
    """Whether this x86-64 CPU has FMA instructions (then kernels are built with contraction into FMAs)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return platform.machine() == "aarch64"  # AArch64 always has fused multiply-add
    try:
        return " fma " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def build(source: str, options: tuple[str, ...] = (), extra_flags: tuple[str, ...] = ()) -> Path:
    """The shared library for ``source``, compiled on first use and cached by content."""
    cxx = _compiler()
    unit = translation_unit(source)
    flags = compiler_flags(options, extra_flags)
    headers = "\0".join((HERE / h).read_text() for h in HEADERS)
    key_text = "\0".join([unit, headers, " ".join(flags), _compiler_version(cxx), platform.machine()])
    key = hashlib.sha256(key_text.encode()).hexdigest()[:20]
    target = cache_dir() / "kernels" / "cuda_cpu" / f"{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src = Path(tmp) / "kernel.cpp"
        src.write_text(unit)
        obj, lib = Path(tmp) / "kernel.o", Path(tmp) / target.name
        # Two steps: linking with -fsanitize=thread would pull in the sanitizer's run-time library.
        for cmd in ([cxx, *flags, "-c", str(src), "-o", str(obj)], [cxx, "-shared", str(obj), "-o", str(lib)]):
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise EmulatorBuildError(
                    f"compiling for the CPU layer failed ({' '.join(cmd)}):\n{done.stderr.strip()}"
                )
        os.replace(lib, target)  # atomic: a concurrent build of the same key is harmless
    return target


class LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared_mem", ctypes.c_uint64),
        ("arena", ctypes.c_void_p),
        ("arena_size", ctypes.c_uint64),
        ("page", ctypes.c_uint64),
        ("checks", ctypes.c_uint32),
        ("seed", ctypes.c_uint32),
        ("extents", ctypes.c_void_p),
        ("n_extents", ctypes.c_uint32),
        ("globals_known", ctypes.c_uint32),
        ("static_map", ctypes.c_void_p),
        ("static_map_len", ctypes.c_uint64),
    ]


CHECK_MEMORY = 1  # cuda_cpu.h's kCheckMemory
CHECK_RACES = 2


# The arena's layout; cuda_cpu.h checks each launch's arena against its own constants.
ARENA_THREADS = 1024
STACK_BYTES = 128 * 1024
MAX_DYNAMIC_SHARED = 227 * 1024


@dataclass(frozen=True)
class Arena:
    """The fiber stacks (each above a PROT_NONE page) and the dynamic shared memory (then a
    PROT_NONE page) that every module's launches use, one launch at a time (``lock``). One
    arena per process keeps the number of mappings (each guard page splits one) independent of
    the number of modules loaded."""

    memory: mmap.mmap
    address: int
    size: int
    page: int
    lock: threading.Lock


@cache
def arena() -> Arena:
    page = mmap.PAGESIZE
    stacks = ARENA_THREADS * (page + STACK_BYTES)
    smem = -(-MAX_DYNAMIC_SHARED // page) * page
    size = stacks + smem + page
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    address = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    guards = [address + i * (page + STACK_BYTES) for i in range(ARENA_THREADS)] + [address + stacks + smem]
    if any(libc.mprotect(g, page, 0) != 0 for g in guards):  # PROT_NONE
        raise EmulatorBuildError(f"mprotect failed for the CPU layer's guard pages (errno {ctypes.get_errno()})")
    return Arena(memory, address, size, page, threading.Lock())


@dataclass(frozen=True)
class LoadedKernel:
    """One kernel's entry points and what the launch checks need to know about it."""

    name: str
    launch: Any  # the ctypes function of the launch entry point
    param_names: tuple[str, ...]
    param_sizes: tuple[int, ...]
    param_kinds: str  # per parameter: p(ointer) f(loat) i/u (signed/unsigned integer) o(ther)
    max_threads: int


def load(library: Path, kernels: list[KernelSignature]) -> tuple[dict[str, LoadedKernel], int, int]:
    """The kernels of a built library, its static shared memory size in bytes and the offset of
    that memory in the library (for ``debuginfo.shared_layout``)."""
    lib = ctypes.CDLL(str(library))
    lib.forge_emu_static_shared.restype = ctypes.c_size_t
    lib.forge_emu_static_shared_offset.restype = ctypes.c_ulong
    loaded = {}
    for k in kernels:
        launch = getattr(lib, f"forge_emu_launch__{k.name}")
        launch.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        launch.restype = ctypes.c_int
        describe = getattr(lib, f"forge_emu_params__{k.name}")
        describe.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
        capacity = 64
        sizes = (ctypes.c_int * capacity)()
        kinds = ctypes.create_string_buffer(capacity)
        n = describe(ctypes.addressof(sizes), kinds, capacity)
        max_threads = getattr(lib, f"forge_emu_max_threads__{k.name}")
        max_threads.restype = ctypes.c_int
        names = k.param_names if len(k.param_names) == n else tuple(f"#{i}" for i in range(n))
        loaded[k.name] = LoadedKernel(
            k.name, launch, names, tuple(sizes[:n]), kinds.raw[:n].decode(), int(max_threads())
        )
    return loaded, int(lib.forge_emu_static_shared()), int(lib.forge_emu_static_shared_offset())
