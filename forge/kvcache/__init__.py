"""KV cache managers: block bookkeeping only (pure Python). The tensors belong to the kernel backend.

Imports only ``forge.core``; never a kernel, a model or torch."""
