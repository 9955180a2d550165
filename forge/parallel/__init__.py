"""Tensor parallelism: how a decoder model is cut across ranks (``shard``: Megatron-style column- and
row-parallel linears, heads and vocabulary split) and the collectives the shards call
(``group``: ``torch.distributed``, gloo on CPU, NCCL on CUDA). May import: core, kernels, models."""
