"""Studies: ``python -m experiments.run <study> [--size small|tiny]`` regenerates ``reports/<study>/``."""
