"""A CuPy-shaped stand-in that runs forge's kernels on the CPU layer, checking every launch.

``CpuCuda`` offers what ``forge.kernels.cuda.compiler.KernelLibrary`` uses of CuPy:
``RawModule(code=, options=, name_expressions=)``, ``module.get_function(name)``, the
function's ``max_dynamic_shared_size_bytes`` attribute and its launch
``kernel(grid, block, args, shared_mem=)``, and ``cuda.Device`` / ``cuda.ExternalStream``
(context managers with nothing to do: CPU work is synchronous). Device memory is CPU torch
tensors; pointers are their ``data_ptr()``.

Every launch is checked for what a GPU (an H100) would reject or silently get wrong, and
raises ``CudaLaunchError`` instead: more than 1024 threads per block (or above the kernel's
``__launch_bounds__``), block or grid dimensions over CUDA's limits, shared memory above
48 KiB without the opt-in attribute or above 227 KiB at all, an argument count that differs
from the kernel's, and an argument whose byte size or kind (pointer, integer, float) differs
from its parameter's C type. ``graphs`` is the torch.cuda-shaped graph API of this layer
(``forge.kernels.cuda.cpu_emu.graphs``); launches during a capture are recorded in it.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from forge.kernels.cuda.cpu_emu import build, debuginfo
from forge.kernels.cuda.cpu_emu.graphs import CpuGraphs

DEFAULT_SHARED_MEMORY = 48 * 1024
MAX_SHARED_MEMORY_OPTIN = 227 * 1024  # H100 (sm_90) per block
MAX_BLOCK = (1024, 1024, 64)
MAX_GRID = (2**31 - 1, 65535, 65535)
_LINE = re.compile(r"\bline (\d+)\b")
_KIND_NAMES = {"p": "a pointer", "f": "a floating-point value", "i": "an integer", "u": "an integer", "o": "a struct"}


class CudaLaunchError(RuntimeError):
    """A launch a GPU would reject, or a kernel error (divergent barrier, fault) found while it ran."""


def _dims(value: int | tuple[int, ...], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise CudaLaunchError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    full = (*dims, 1, 1)[:3]
    return full[0], full[1], full[2]


def _context(source_lines: list[str], message: str) -> str:
    """The source lines a kernel error message names, appended to it."""
    lines = sorted({int(n) for n in _LINE.findall(message)})
    shown = [f"  line {n}: {source_lines[n - 1].strip()}" for n in lines if 0 < n <= len(source_lines)]
    return "\n".join([message, *shown])


@dataclass(frozen=True)
class ModuleInfo:
    """What a module's kernels need to check launches and to explain their errors."""

    library: Path
    static_shared: int  # the module's total: an upper bound for each kernel
    layout: debuginfo.SharedLayout
    dynamic_names: dict[str, tuple[str, ...]]  # per kernel, its extern __shared__ arrays
    source_lines: list[str]


class CpuKernel:
    """A compiled kernel, launched like a CuPy ``Function``."""

    def __init__(self, runtime: CpuCuda, kernel: build.LoadedKernel, module: ModuleInfo) -> None:
        self.runtime = runtime
        self.kernel = kernel
        self.module = module
        self.static_shared = module.static_shared
        self._static_map = ctypes.create_string_buffer(module.layout.valid, max(len(module.layout.valid), 1))
        self._max_dynamic_shared = 0

    @property
    def max_dynamic_shared_size_bytes(self) -> int:
        return self._max_dynamic_shared

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value: int) -> None:
        if not 0 <= value <= self.runtime.max_shared_memory - self.static_shared:
            raise CudaLaunchError(
                f"{self.kernel.name}: max_dynamic_shared_size_bytes={value} exceeds what the device allows "
                f"({self.runtime.max_shared_memory} bytes minus {self.static_shared} of static shared memory)"
            )
        self._max_dynamic_shared = value

    def __call__(
        self,
        grid: int | tuple[int, ...],
        block: int | tuple[int, ...],
        args: tuple[Any, ...],
        shared_mem: int = 0,
        stream: Any = None,
    ) -> None:
        grid3, block3 = _dims(grid, "grid"), _dims(block, "block")
        self.check(grid3, block3, args, shared_mem)
        extents = self.runtime.extents(args, self.kernel.param_kinds)
        self.runtime.submit(lambda: self.run(grid3, block3, args, shared_mem, extents))

    def check(
        self, grid: tuple[int, int, int], block: tuple[int, int, int], args: tuple[Any, ...], shared: int
    ) -> None:
        k = self.kernel
        threads = block[0] * block[1] * block[2]
        if any(b < 1 for b in block) or any(b > m for b, m in zip(block, MAX_BLOCK, strict=True)) or threads > 1024:
            raise CudaLaunchError(f"{k.name}: block {block} exceeds CUDA's limits (1024 threads, z <= 64)")
        if threads > k.max_threads:
            raise CudaLaunchError(
                f"{k.name}: {threads} threads per block exceed its __launch_bounds__ ({k.max_threads})"
            )
        if any(g < 1 for g in grid) or any(g > m for g, m in zip(grid, MAX_GRID, strict=True)):
            raise CudaLaunchError(f"{k.name}: grid {grid} exceeds CUDA's limits {MAX_GRID}")
        if shared < 0 or shared + self.static_shared > self.runtime.max_shared_memory:
            raise CudaLaunchError(
                f"{k.name}: {shared} bytes of dynamic shared memory (+{self.static_shared} static) exceed the "
                f"device's {self.runtime.max_shared_memory} bytes per block"
            )
        if shared + self.static_shared > DEFAULT_SHARED_MEMORY and shared > self._max_dynamic_shared:
            raise CudaLaunchError(
                f"{k.name}: {shared} bytes of dynamic shared memory need the opt-in above 48 KiB "
                f"(max_dynamic_shared_size_bytes is {self._max_dynamic_shared})"
            )
        if len(args) != len(k.param_sizes):
            raise CudaLaunchError(f"{k.name}: takes {len(k.param_sizes)} arguments, got {len(args)}")
        for i, arg in enumerate(args):
            name, size, kind = k.param_names[i], k.param_sizes[i], k.param_kinds[i]
            if not isinstance(arg, np.generic):
                raise CudaLaunchError(
                    f"{k.name}: argument {i} ({name}) must be a NumPy scalar, got {type(arg).__name__}"
                )
            ok = arg.itemsize == size and (
                (kind == "p" and isinstance(arg, np.integer))
                or (kind in "iu" and isinstance(arg, np.integer))
                or (kind == "f" and isinstance(arg, np.floating))
            )
            if not ok:
                raise CudaLaunchError(
                    f"{k.name}: argument {i} ({name}) is {_KIND_NAMES[kind]} of {size} bytes in the kernel, but a "
                    f"{arg.dtype} ({arg.itemsize} bytes) was passed"
                )

    def run(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: tuple[Any, ...],
        shared: int,
        extents: tuple[int, ...] | None = None,
    ) -> None:
        """Execute the launch now (``__call__`` checks first and may record it in a graph).
        ``extents``: (first byte, end, argument index) of each pointer argument's buffer, when
        every one is known (``CpuCuda.extents``); global accesses outside them then fail."""
        n = len(args)
        slots = (ctypes.c_uint64 * max(n, 1))()
        base = ctypes.addressof(slots)
        for i, arg in enumerate(args):
            ctypes.memmove(base + 8 * i, arg.tobytes(), arg.itemsize)
        pointers = (ctypes.c_void_p * max(n, 1))(*[base + 8 * i for i in range(n)])
        arena = build.arena()
        known = (ctypes.c_uint64 * max(len(extents or ()), 1))(*(extents or ()))
        layout = self.module.layout
        config = build.LaunchConfig(
            grid, block, shared, arena.address, arena.size, arena.page, self.runtime.checks,
            self.runtime.next_seed(), ctypes.addressof(known), len(extents or ()) // 3, extents is not None,
            ctypes.addressof(self._static_map) if layout.valid else None, len(layout.valid),
        )  # fmt: skip
        error = ctypes.create_string_buffer(2048)
        with arena.lock:
            failed = self.kernel.launch(ctypes.byref(config), ctypes.addressof(pointers), error, len(error))
        if failed:
            m = self.module
            message = debuginfo.describe(
                error.value.decode(errors="replace"),
                m.library,
                layout,
                self.kernel.param_names,
                m.dynamic_names.get(self.kernel.name, ()),
            )
            raise CudaLaunchError(_context(m.source_lines, f"{self.kernel.name}: {message}"))


class CpuRawModule:
    """``cupy.RawModule`` for the CPU layer: the source is compiled (or found in the cache) here."""

    def __init__(
        self,
        runtime: CpuCuda,
        code: str,
        options: tuple[str, ...] = (),
        name_expressions: tuple[str, ...] | None = None,
    ) -> None:
        self.code = code
        self.options = tuple(options)
        signatures = build.kernel_signatures(code)
        library: Path = build.build(code, self.options, runtime.extra_flags)
        loaded, static_shared, offset = build.load(library, signatures)
        unit = build.translation_unit(code)
        info = ModuleInfo(
            library,
            static_shared,
            debuginfo.shared_layout(library, offset, static_shared),
            build.dynamic_shared_names(code),
            unit.splitlines(),
        )
        self._kernels = {name: CpuKernel(runtime, k, info) for name, k in loaded.items()}
        missing = [n for n in name_expressions or () if n not in self._kernels]
        if missing:
            raise build.EmulatorBuildError(f"name expressions not found among the kernels: {missing}")

    def get_function(self, name: str) -> CpuKernel:
        try:
            return self._kernels[name]
        except KeyError:
            raise KeyError(f"no __global__ function {name!r} in the module ({sorted(self._kernels)})") from None


class _NoOpContext:
    def __enter__(self) -> _NoOpContext:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _CudaNamespace:
    """``cupy.cuda`` as far as forge touches it."""

    def __init__(self, runtime: CpuCuda) -> None:
        self._runtime = runtime

    def Device(self, index: int = 0) -> _NoOpContext:
        if index != 0:
            raise CudaLaunchError(f"the CPU layer has one device (0), not {index}")
        return _NoOpContext()

    def ExternalStream(self, handle: int, device_id: int = 0) -> _NoOpContext:
        return _NoOpContext()


class CpuCuda:
    """The CPU layer: a CuPy stand-in (``RawModule``, ``cuda``) and a graph API (``graphs``).

    ``extra_flags``: additional compiler flags (tests build the ucontext variant with
    ``-DFORGE_EMU_UCONTEXT``). Launches of all instances share one arena and run one at a time.
    """

    device_type = "cpu"

    def __init__(
        self, max_shared_memory: int = MAX_SHARED_MEMORY_OPTIN, extra_flags: tuple[str, ...] = (), checks: bool = True
    ) -> None:
        if not DEFAULT_SHARED_MEMORY <= max_shared_memory <= MAX_SHARED_MEMORY_OPTIN:
            raise ValueError(f"max_shared_memory must be in {DEFAULT_SHARED_MEMORY}..{MAX_SHARED_MEMORY_OPTIN}")
        self.max_shared_memory = max_shared_memory
        self.extra_flags = extra_flags
        self.checks = build.CHECK_MEMORY | build.CHECK_RACES if checks else 0
        # id of a kernel_pointer argument -> (the argument, its tensor's storage first byte and end);
        # holding the argument keeps its id from being reused while the entry exists
        self._buffers: dict[int, tuple[np.uint64, int, int]] = {}
        self._launches = 0
        self.cuda = _CudaNamespace(self)
        self.graphs = CpuGraphs()

    def RawModule(
        self, code: str, options: tuple[str, ...] = (), name_expressions: tuple[str, ...] | None = None
    ) -> CpuRawModule:
        return CpuRawModule(self, code, options, name_expressions)

    def submit(self, launch: Any) -> None:
        """Run a checked launch, recording it first when a graph is being captured."""
        self.graphs.record_launch(launch)
        launch()

    @staticmethod
    def stream_handle() -> int:
        return 0

    def kernel_pointer(self, t: torch.Tensor) -> np.uint64:
        """``t``'s address as a kernel argument (``KernelLibrary.pointer``), remembering its
        storage's bytes: launches whose every pointer came from here check global accesses."""
        storage = t.untyped_storage()
        if len(self._buffers) > 4096:  # only the launches being made (or captured) now need theirs
            self._buffers.clear()
        pointer = np.uint64(t.data_ptr())
        self._buffers[id(pointer)] = (pointer, storage.data_ptr(), storage.data_ptr() + storage.nbytes())
        return pointer

    def extents(self, args: tuple[Any, ...], kinds: str) -> tuple[int, ...] | None:
        """(first byte, end, argument index) per pointer argument, or None if one is unknown (a
        raw address rather than a ``kernel_pointer``)."""
        out: list[int] = []
        for i, (arg, kind) in enumerate(zip(args, kinds, strict=False)):
            if kind == "p":
                entry = self._buffers.get(id(arg))
                if entry is None or entry[0] is not arg:
                    return None
                out += [entry[1], entry[2], i]
        return tuple(out)

    def next_seed(self) -> int:
        """A number per launch that picks its schedule (block and thread orders, cuda_cpu.h)."""
        self._launches += 1
        return self._launches & 0xFFFFFFFF
