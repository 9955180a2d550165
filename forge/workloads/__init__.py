"""Seeded workloads: arrivals and lengths (``synthetic``), shared system prompts and trace replay.

Imports only ``forge.core`` and ``forge.tokenizers``."""
