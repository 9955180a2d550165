"""KV cache managers: block bookkeeping only (pure Python). The tensors belong to the kernel backend."""
