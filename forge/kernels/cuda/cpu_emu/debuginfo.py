"""Names for the addresses in the CPU layer's check errors: source lines and shared variables.

The checks (``cuda_cpu_check.h``) report a failing access as ``pc 0x...`` (an offset in the
kernel's library) and shared memory as a byte offset. ``binutils`` turns them into words:
``addr2line`` gives the source lines of the pc (inlined functions included), ``nm`` the static
``__shared__`` variables with their sizes, from which ``shared_layout`` also builds the map of
valid bytes that the bounds check of static shared memory reads.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from forge.kernels.cuda.cpu_emu.build import GUARD_BYTES, PADDED_PREFIX

_PC = re.compile(r"\(pc 0x([0-9a-f]+)\)")
_STATIC_BYTE = re.compile(r"static shared byte (\d+)")
_ARGUMENT = re.compile(r"argument #(-?\d+)")
_DYNAMIC_BYTE = re.compile(r"dynamic shared byte (-?\d+)")


@dataclass(frozen=True)
class SharedVariable:
    name: str  # as declared, with its function: "rms_norm::scratch"
    start: int  # byte offset in the static shared section
    size: int  # the variable's own bytes (the guard after it excluded)


@dataclass(frozen=True)
class SharedLayout:
    variables: tuple[SharedVariable, ...]
    valid: bytes  # per byte of the section: 0 outside every variable, else its index + 1


def shared_layout(library: Path, section_offset: int, section_size: int) -> SharedLayout:
    """The static ``__shared__`` variables of ``library`` (empty when ``nm`` is not installed:
    then the check of static shared bounds is off, the race and initialisation checks stay on)."""
    if section_size == 0 or shutil.which("nm") is None:
        return SharedLayout((), b"")
    listing = subprocess.run(
        ["nm", "-S", "-C", "--defined-only", str(library)], capture_output=True, text=True, check=False
    ).stdout
    variables = []
    for line in listing.splitlines():
        fields = line.split(maxsplit=3)
        if len(fields) != 4:
            continue
        start = int(fields[0], 16) - section_offset
        if 0 <= start < section_size:
            name, size = fields[3], int(fields[1], 16)
            if PADDED_PREFIX in name:
                name, size = name.replace(PADDED_PREFIX, ""), size - GUARD_BYTES
            variables.append(SharedVariable(name, start, size))
    variables = variables[:255]
    valid = bytearray(section_size)
    for i, v in enumerate(variables):
        valid[v.start : v.start + v.size] = bytes([i + 1]) * v.size
    return SharedLayout(tuple(variables), bytes(valid))


def _lines(library: Path, pc: int) -> str:
    if shutil.which("addr2line") is None:
        return f"pc 0x{pc:x}"
    out = subprocess.run(
        ["addr2line", "-e", str(library), "-f", "-i", "-C", f"0x{pc:x}"], capture_output=True, text=True, check=False
    ).stdout.split("\n")
    frames = []
    for function, where in zip(out[0::2], out[1::2], strict=False):
        line = where.rsplit(":", 1)[-1].split()[0] if ":" in where else "?"
        frames.append(f"line {line} ({function.split('(')[0]})")
    return ", inlined at ".join(frames) if frames else f"pc 0x{pc:x}"


def _static_name(layout: SharedLayout, byte: int) -> str:
    for v in layout.variables:
        if v.start <= byte < v.start + v.size:
            return f"__shared__ {v.name}, byte {byte - v.start} of {v.size}"
        if v.start + v.size <= byte < v.start + v.size + GUARD_BYTES:
            return f"{byte - v.start - v.size + 1} bytes past the end of __shared__ {v.name} ({v.size} bytes)"
    return f"static shared byte {byte}"


def describe(
    message: str, library: Path, layout: SharedLayout, params: tuple[str, ...], dynamic: tuple[str, ...]
) -> str:
    """``message`` with its pc, shared offsets and argument numbers in source terms."""
    message = _PC.sub(lambda m: f"at {_lines(library, int(m.group(1), 16))}", message)
    message = _STATIC_BYTE.sub(lambda m: _static_name(layout, int(m.group(1))), message)
    names = " / ".join(f"extern __shared__ {n}[]" for n in dynamic) or "dynamic shared memory"
    message = _DYNAMIC_BYTE.sub(lambda m: f"{names}, byte {m.group(1)}", message)
    return _ARGUMENT.sub(
        lambda m: f"argument {m.group(1)} ({params[int(m.group(1))]})" if 0 <= int(m.group(1)) < len(params) else "",
        message,
    )
