"""Seeded sampling and logits processors: a row's token depends only on its logits, its request's
parameters and history, and its (seed, position) pair, never on the batch.

Shared by the engine's runner and the speculative verifiers; imports only ``forge.core``."""
