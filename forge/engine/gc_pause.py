"""Fewer cyclic-GC passes while a run builds or holds many objects (``Engine.run``, a workload's
requests): the passes would scan surviving objects again and again and find no garbage."""

from __future__ import annotations

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def rare_gc(gen0_threshold: int = 100_000) -> Iterator[None]:
    """Raise the GC's first-generation threshold for the block, then restore it; on entry and on exit
    age every tracked object to the oldest generation (``age_all``). Each step creates and drops
    thousands of small containers (per-request outputs, chunks, token lists); with the default
    threshold (700) the collector runs several times a step and its passes cost ~15-20% of a simulated
    run (reports/simulation_speed). Cycles are still collected, only less often."""
    old = gc.get_threshold()
    age_all()
    gc.set_threshold(max(gen0_threshold, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        age_all()


@contextmanager
def paused_gc() -> Iterator[None]:
    """No cyclic-GC pass at all in the block, the collector enabled again after if it was: for a block
    that builds many objects and drops no cycles (a workload's requests: ``rare_gc``'s passes over a
    million of them cost ~0.6 CPU-s and find nothing). Everything alive is aged to the oldest
    generation on entry and on exit (``age_all``), as ``rare_gc`` does."""
    enabled = gc.isenabled()
    age_all()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
        age_all()


def age_all() -> None:
    """Move every object the collector tracks to its oldest generation without a pass over them
    (``gc.freeze`` then ``gc.unfreeze``), so the young-generation passes after it do not scan them:
    what a block of code left alive (a run's records, a workload's prompts) is not rescanned by the
    next few thousand allocations' collections. The oldest generation is still collected, though less
    often (aged objects do not count towards the pending objects that trigger a full collection).
    Nothing is done while the process holds frozen objects of its own (``gc.freeze``, e.g. before a
    fork): ``unfreeze`` would release them too."""
    if gc.get_freeze_count():
        return
    gc.freeze()
    gc.unfreeze()


PYTHON_DEFAULT_THRESHOLDS = (700, 10, 10)


@contextmanager
def default_gc() -> Iterator[None]:
    """Python's default GC thresholds for the block (``forge serve``'s serving loop, which a command
    under ``rare_gc`` starts), the previous ones restored after; everything built before it (the
    model, the app) is aged to the oldest generation first (``age_all``), so the serving loop's
    young-generation passes do not rescan it."""
    old = gc.get_threshold()
    age_all()
    gc.set_threshold(*PYTHON_DEFAULT_THRESHOLDS)
    try:
        yield
    finally:
        gc.set_threshold(*old)


def no_collection_at_exit() -> None:
    """Skip the full collection the interpreter runs as it exits (``gc.freeze`` in an ``atexit``
    hook: the objects it would scan — torch's, Hydra's, the run's — are left to the process's end).
    It cost ~0.2 CPU-s of each ``forge run``. Registered once however often it is called; for a
    process that is about to exit anyway (the ``forge`` command), never for a library user."""
    atexit.unregister(gc.freeze)
    atexit.register(gc.freeze)
