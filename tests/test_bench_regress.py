"""The regression gate's arithmetic (benchmarks/regress.py): normalised by the calibration loop,
failed above the threshold. Its behaviour on real runs is in reports/regress/README.md."""

from __future__ import annotations

import pytest

from benchmarks.regress import CALIBRATION, compare, normalise


def test_normalise_divides_by_the_calibration_loop_and_drops_it() -> None:
    assert normalise({CALIBRATION: 2e-4, "a": 5e-4, "b": 1e-4}) == pytest.approx({"a": 2.5, "b": 0.5})
    with pytest.raises(SystemExit, match=CALIBRATION):
        normalise({"a": 1.0})


def test_a_machine_twice_as_slow_overall_is_no_regression() -> None:
    fast = normalise({CALIBRATION: 1e-4, "step": 3e-4})
    slow = normalise({CALIBRATION: 2e-4, "step": 6e-4})
    assert compare(slow, fast, 0.1)[1] == []


def test_compare_fails_only_what_slowed_past_the_threshold() -> None:
    base = {"same": 1.0, "slower": 1.0, "a_bit": 1.0, "gone": 1.0}
    now = {"same": 1.0, "slower": 1.2, "a_bit": 1.05, "new": 3.0}
    lines, failed = compare(now, base, 0.1)
    assert failed == ["slower"]
    assert len(lines) == 5 and any("only in the baseline" in ln for ln in lines)
