"""A fixed pure-Python workload (dict, list and attribute traffic like the scheduler's), measured in
the same run as the other suites: ``benchmarks/regress.py`` divides every benchmark by it, so a
machine that is slower overall (another CPU, a shared core's caches) does not read as a regression."""

from __future__ import annotations

from typing import Any

CALIBRATION_NAME = "test_calibration_loop"


class _Row:
    __slots__ = ("blocks", "rid", "tokens")

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.tokens: list[int] = []
        self.blocks: list[int] = []


def calibration_work(num_rows: int = 256, steps: int = 4) -> int:
    """Deterministic work: returns a checksum so nothing is optimised away."""
    rows = [_Row(f"r{i}") for i in range(num_rows)]
    table: dict[str, _Row] = {r.rid: r for r in rows}
    free = list(range(num_rows * steps))
    total = 0
    for step in range(steps):
        for r in rows:
            r.tokens.append(step)
            if len(r.tokens) % 2 == 1:
                r.blocks.append(free.pop())
            total += len(table[r.rid].blocks)
    for r in rows:
        free.extend(r.blocks)
    return total + len(free)


def test_calibration_loop(benchmark: Any) -> None:
    result = benchmark.pedantic(calibration_work, rounds=200, warmup_rounds=10)
    assert result == calibration_work()
