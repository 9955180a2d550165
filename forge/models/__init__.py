"""Models: ``forward(ForwardBatch, kv_caches, backend) -> logits`` for the positions to sample."""
