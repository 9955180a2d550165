"""forge's CUDA kernels on the CPU, under CUDA's execution model (see ``cuda_cpu.h``).

``CpuCuda`` (``runtime``) stands in for CuPy and for ``torch.cuda``'s graph API, so
``CudaBackend(device="cpu", runtime=CpuCuda())`` runs the unmodified ``.cu`` sources through
forge's own ``KernelLibrary`` / ``CudaOps`` and ``GraphRunner`` on a machine without a GPU.
It lives in the package (not under tests/) so that it ships next to the sources it compiles
and anyone can reproduce a kernel failure with ``backend=cuda`` logic on a laptop; it is
a correctness tool (one OS thread, blocks in sequence), not a fast path.
"""

from forge.kernels.cuda.cpu_emu.runtime import CpuCuda, CudaLaunchError

__all__ = ["CpuCuda", "CudaLaunchError"]
