"""Workloads beyond the synthetic one: shared system prompts and trace replay.
The base classes and length / arrival distributions live in ``forge.workload``."""
