"""Kernel backends: the ops a model calls, and the KV tensors they read and write."""
