"""Benchmark clients (``python -m forge.bench.serve``) and measurements."""
