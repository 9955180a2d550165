"""Seeded workloads: arrivals and lengths (``synthetic``), Vidur's Poisson arrivals (``vidur_arrivals``),
shared system prompts and trace replay.

Imports only ``forge.core`` and ``forge.tokenizers``."""
