"""forge's own CPU kernels: C sources in this package, compiled on first use by the machine's C
compiler into a cache outside the repository and called through ``ctypes`` (``native``).
Nothing here compiles at import time; ``forge.kernels.cpu_backend`` is the entry."""
