"""Benchmarks that need hardware CI lacks (run by hand)."""
