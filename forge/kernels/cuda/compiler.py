"""Compile the package's ``.cu`` sources with CuPy (NVRTC) and launch them on torch's stream.

CuPy is imported only by ``import_cupy``, which the CUDA backend calls when it is built.
Kernel arguments are passed as NumPy scalars of the exact C type (``ptr`` for a tensor's
device address as a 64-bit value, ``i32``/``i64``/``f32``), so nothing is copied and no
CuPy array is created. Launches go to ``torch.cuda.current_stream()``, which is the capture
stream while a CUDA graph is being recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from forge.kernels.cuda.sources import COMMON_OPTIONS, define_options, defines_for, expand_source


def missing_requirements() -> list[str]:
    """What this machine lacks for the CUDA backend, in words; empty when nothing is."""
    missing = []
    if not torch.cuda.is_available():
        built = torch.version.cuda or "no CUDA"
        missing.append(
            f"a CUDA GPU visible to torch (torch.cuda.is_available() is False; torch {torch.__version__} "
            f"built with {built})"
        )
    try:
        import_cupy()
    except Exception as exc:  # ImportError, or CuPy failing to find its CUDA libraries
        missing.append(f"CuPy (pip install 'forge[cuda]' or cupy-cuda12x; import failed: {exc})")
    return missing


def import_cupy() -> Any:
    import cupy

    return cupy


def ptr(t: torch.Tensor) -> np.uint64:
    return np.uint64(t.data_ptr())


def i32(v: int) -> np.int32:
    return np.int32(v)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


def device_shared_memory(device_index: int) -> int:
    """Shared memory one block may opt in to on this CUDA device, in bytes."""
    props = torch.cuda.get_device_properties(device_index)
    return int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


def torch_stream_handle(device_index: int) -> Callable[[], int]:
    """The handle of torch's current stream on the device (the capture stream during graph capture)."""
    return lambda: int(torch.cuda.current_stream(device_index).cuda_stream)


class KernelLibrary:
    """Compiled kernels for one device, one CuPy ``RawModule`` per (source, macros).

    ``cupy``: the CuPy module, or the CPU layer's stand-in (``forge.kernels.cuda.cpu_emu``).
    ``max_shared_memory``: the device's per-block opt-in limit. ``stream_handle``: returns the
    stream to launch on, at each launch.
    """

    def __init__(self, cupy: Any, device_index: int, max_shared_memory: int, stream_handle: Callable[[], int]) -> None:
        self._cupy = cupy
        self.device_index = device_index
        self._device = cupy.cuda.Device(device_index)
        self._modules: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}
        self._functions: dict[tuple[str, str, tuple[tuple[str, int], ...]], Any] = {}
        self._streams: dict[int, Any] = {}
        self._shared_mem_set: dict[int, int] = {}
        self._stream_handle = stream_handle
        self.max_shared_memory = max_shared_memory
        # A tensor as a pointer argument: its address; the CPU layer also notes its storage's
        # bytes, to check the kernel's global accesses against them.
        self.pointer: Callable[[torch.Tensor], Any] = getattr(cupy, "kernel_pointer", ptr)

    def function(self, source: str, name: str, dtype: torch.dtype, **extra: int) -> Any:
        """The kernel ``name`` of ``source`` built for ``dtype`` and macros ``FORGE_<KEY>=value``."""
        defines = defines_for(dtype, **extra)
        key = (source, name, tuple(sorted(defines.items())))
        fn = self._functions.get(key)
        if fn is None:
            mkey = (source, key[2])
            module = self._modules.get(mkey)
            if module is None:
                options = (*COMMON_OPTIONS, *define_options(defines))
                with self._device:
                    module = self._cupy.RawModule(code=expand_source(source), options=options)
                self._modules[mkey] = module
            with self._device:
                fn = module.get_function(name)
            self._functions[key] = fn
        return fn

    def launch(
        self,
        kernel: Any,
        grid: tuple[int, ...],
        block: tuple[int, ...],
        args: tuple[Any, ...],
        shared_mem: int = 0,
    ) -> None:
        if shared_mem > 48 * 1024:
            if shared_mem > self.max_shared_memory:
                raise ValueError(
                    f"kernel needs {shared_mem} bytes of shared memory; the device allows {self.max_shared_memory}"
                )
            if self._shared_mem_set.get(id(kernel), 0) < shared_mem:
                kernel.max_dynamic_shared_size_bytes = shared_mem  # opt in beyond the 48 KiB default
                self._shared_mem_set[id(kernel)] = shared_mem
        with self._device, self._stream():
            kernel(grid, block, args, shared_mem=shared_mem)

    def _stream(self) -> Any:
        handle = self._stream_handle()
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._cupy.cuda.ExternalStream(handle, self.device_index)
            self._streams[handle] = stream
        return stream
