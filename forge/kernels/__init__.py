"""Kernel backends: the ops a model calls, the flat batch they consume, and the KV tensors they read
and write (torch reference, forge's C kernels for the CPU, forge's CUDA C kernels through CuPy).

Imports only ``forge.core``: a model reaches a backend through ``ForwardModel``, never by import."""
