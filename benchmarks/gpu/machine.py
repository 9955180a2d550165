"""What the device check runs on: Python, torch, the GPU it sees, CuPy and NVRTC (issue 39).

    python benchmarks/gpu/machine.py cuda|cpu

Prints one ``key: value`` line each. With ``cuda`` it fails (exit 1) when torch sees no GPU or
CuPy does not import: every later step of the device check would then be measuring nothing.
"""

from __future__ import annotations

import platform
import sys

import torch


def torch_lines() -> list[str]:
    lines = [f"python: {platform.python_version()} ({sys.executable})", f"torch: {torch.__version__}"]
    lines.append(f"torch cuda: {torch.version.cuda}, available: {torch.cuda.is_available()}")
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(
            f"gpu: {props.name}, compute capability {props.major}.{props.minor}, "
            f"{props.multi_processor_count} SMs, {props.total_memory / 2**30:.1f} GiB"
        )
    return lines


def cupy_lines() -> tuple[list[str], bool]:
    """CuPy's lines, and whether CuPy reached the CUDA driver."""
    try:
        import cupy  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        return [f"cupy: not importable ({exc})"], False
    lines = [f"cupy: {cupy.__version__}"]
    try:
        lines.append(f"cuda runtime: {cupy.cuda.runtime.runtimeGetVersion()}")
        lines.append(f"cuda driver: {cupy.cuda.runtime.driverGetVersion()}")
    except Exception as exc:  # no driver: report it, the caller decides
        return [*lines, f"cupy cuda: unavailable ({exc})"], False
    try:
        lines.append(f"nvrtc: {cupy.cuda.nvrtc.getVersion()}")
    except Exception as exc:  # informative only
        lines.append(f"nvrtc: version unknown ({exc})")
    return lines, True


def main(argv: list[str]) -> int:
    want_gpu = argv[1:] == ["cuda"]
    cupy, cupy_ok = cupy_lines()
    print("\n".join(torch_lines() + cupy))
    if want_gpu and not (torch.cuda.is_available() and cupy_ok):
        print("no usable GPU: torch must see one and CuPy must import and reach the driver")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
