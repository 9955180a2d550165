"""forge's own CUDA kernels: ``.cu`` sources in this package, compiled at run time by CuPy.

``sources`` knows the files and how to compile them, ``compiler`` turns them into CuPy
kernels launched on torch's current stream, ``ops`` wraps each kernel as a typed function on
torch tensors (raw device pointers, no copies; its parts ``ops_common`` and ``ops_attention``)
and ``quant`` holds the GGUF-quantized weight type. Nothing here imports CuPy at import time;
``forge.kernels.cuda_backend`` is the entry.
"""
