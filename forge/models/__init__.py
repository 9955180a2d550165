"""Models: ``forward(ForwardBatch, kv_caches, backend) -> logits`` for the positions to sample, the
families (one file each plus a ``registry`` entry), their loaders (GGUF, SafeTensors) and weight formats.

Imports ``forge.core``, ``forge.kernels`` and ``forge.tokenizers``; never the scheduler or the engine."""
