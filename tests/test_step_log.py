"""The recorder's steps kept column-wise (``forge.results.step_log.StepLog``): a sequence of ``StepRecord``
that reads back every step as recorded, drops a slice as a server's recorder does, and gives the frame
(int64 and float64 columns) that a list of the named tuples gave."""

from __future__ import annotations

import pandas as pd

from forge.results.step_log import StepLog, StepRecord


def record(i: int) -> StepRecord:
    return StepRecord(i, 0.5 * i, 0.5 * i + 0.25, 3, 40 + i, 37, 3, 0, 0, i % 2, 3, 0, 0.125 * (i % 8), *range(6))


def test_steps_read_back_as_recorded_across_the_pending_batch() -> None:
    log = StepLog()
    steps = [record(i) for i in range(2500)]  # more than one batch moved into the columns
    for s in steps[:1200]:
        log.append(tuple(s))
    log.extend(tuple(s) for s in steps[1200:])
    assert len(log) == 2500
    assert log[0] == steps[0] and log[-1] == steps[-1] and log[1500].num_tokens == 1540
    assert list(log) == steps and log[10:13] == steps[10:13]
    assert log.column("end_time").tolist() == [s.end_time for s in steps]


def test_a_slice_dropped_leaves_the_rest_in_order() -> None:
    log = StepLog()
    for i in range(5000):
        log.append(tuple(record(i)))
    del log[:4500]  # into the steps not yet moved into the columns
    assert len(log) == 500 and log[0] == record(4500)
    log.append(tuple(record(7)))
    assert log[-1] == record(7) and len(log) == 501


def test_the_frame_is_the_named_tuples_frame() -> None:
    steps = [record(i) for i in range(300)]
    log = StepLog()
    for s in steps:
        log.append(tuple(s))
    expected = pd.DataFrame(steps, columns=list(StepRecord._fields))
    pd.testing.assert_frame_equal(log.frame(), expected)
    assert log.frame().equals(expected)
    assert StepLog().frame().equals(pd.DataFrame([]))
