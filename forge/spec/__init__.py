"""Speculative decoding: drafters propose tokens, the target verifies them in one forward.

- ``base``: the ``Drafter`` contract, ``Draft``, per-request draft bounds and ``SpecDecodeStats``.
- ``ngram``: prompt lookup with an adaptive draft length per request.
- ``draft_model``: any forge model drafting with its own KV cache.
- ``verify``: the verification rule (greedy prefix match / coupled sampling); it needs torch, so the
  package does not import it (a simulated run with an n-gram drafter never loads torch).

Imports ``forge.core``, ``forge.sampling``, ``forge.models``, ``forge.kernels``, ``forge.kvcache`` and
``forge.tokenizers``; never the engine that calls it.
"""

from forge.spec.base import Draft, Drafter, SpecDecodeStats, draft_limit

__all__ = ["Draft", "Drafter", "SpecDecodeStats", "draft_limit"]
