"""``rare_gc``: the GC's thresholds come back, nothing stays frozen, and cycles made inside are collected;
``paused_gc``: no pass inside, the collector as it was after."""

from __future__ import annotations

import gc
import weakref

import pytest

from forge.engine.gc_pause import age_all, paused_gc, rare_gc


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def test_thresholds_restored_and_nothing_frozen() -> None:
    before = gc.get_threshold()
    with rare_gc(gen0_threshold=123_456):
        assert gc.get_threshold()[0] == max(123_456, before[0])
        assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_restored_when_the_block_raises() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), rare_gc():
        raise RuntimeError("boom")
    assert gc.get_threshold() == before


def test_objects_are_aged_not_frozen_and_cycles_still_collected() -> None:
    with rare_gc():
        a, b = Node(), Node()
        a.other, b.other = b, a
    assert any(o is a for o in gc.get_objects(generation=2))  # aged to the oldest generation on exit
    c = Node()
    age_all()
    assert any(o is c for o in gc.get_objects(generation=2))
    ref = weakref.ref(a)
    del a, b
    gc.collect()
    assert ref() is None  # the cycle made inside the block is collected


def test_a_callers_frozen_objects_stay_frozen() -> None:
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 0
        with rare_gc():
            pass
        age_all()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_paused_gc_runs_no_pass_and_restores_the_collector() -> None:
    passes: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            passes.append(info["generation"])

    gc.callbacks.append(count)
    try:
        with paused_gc():
            assert not gc.isenabled()
            nodes = [Node() for _ in range(3 * gc.get_threshold()[0] + 10)]  # several passes' worth
        assert passes == [] and gc.isenabled() and gc.get_freeze_count() == 0
        assert any(o is nodes[-1] for o in gc.get_objects(generation=2))  # aged on exit
        gc.disable()
        with paused_gc():
            pass
        assert not gc.isenabled()  # a collector disabled before stays disabled
    finally:
        gc.enable()
        gc.callbacks.remove(count)


def test_paused_gc_restores_the_collector_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("boom")
    assert gc.isenabled()
