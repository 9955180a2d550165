"""The shared helpers: 95% CIs over seeds (forge.results.stats) and JSON nesting measured before
parsing (forge.server.json_nesting)."""

from __future__ import annotations

import json
import math

import pytest

from forge.results.stats import mean_ci95, t975
from forge.server.json_nesting import NestingError, check_nesting, json_nesting, value_nesting


def test_mean_ci95_of_identical_values_has_no_spread_not_a_rounding_error() -> None:
    for values in ([0.1] * 3, [0.92, math.nextafter(0.92, 1.0), 0.92]):  # the mean or the values off by an ulp
        ci = mean_ci95(values)
        assert (ci.half_width, str(ci)) == (0.0, f"{values[0]:.4g} ± 0")
    assert mean_ci95([0.92, 0.92 + 1e-9, 0.92]).half_width > 0.0


def test_mean_ci95_matches_students_t() -> None:
    ci = mean_ci95([10.0, 12.0, 14.0])
    assert ci.mean == 12.0
    assert ci.half_width == pytest.approx(4.303 * 2.0 / math.sqrt(3))
    assert ci.low < 12.0 < ci.high
    assert str(ci) == "12 ± 5"


def test_mean_ci95_single_value_has_no_interval() -> None:
    ci = mean_ci95([3.0, math.nan])
    assert (ci.mean, ci.n) == (3.0, 1)
    assert math.isnan(ci.half_width)
    assert str(ci) == "3"
    with pytest.raises(ValueError):
        mean_ci95([])


def test_overlap_and_t_table() -> None:
    assert mean_ci95([1.0, 1.1, 0.9]).overlaps(mean_ci95([1.05, 1.0, 1.1]))
    assert not mean_ci95([1.0, 1.01, 0.99]).overlaps(mean_ci95([2.0, 2.01, 1.99]))
    assert t975(1) == 12.706 and t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ("5", 0),
        ('"[[[{"', 0),
        ('{"a": "]]]", "b": [[1, {"c": []}]]}', 5),
        ('["\\"[[", [1]]', 2),
        ("[" * 5000 + "]" * 5000, 5000),
    ],
)
def test_json_nesting_skips_strings(text: str, depth: int) -> None:
    assert json_nesting(text) == depth
    assert json_nesting(text.encode()) == depth


def test_check_nesting_refuses_deep_text_without_recursion() -> None:
    deep = '{"a":' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(NestingError, match="100000 levels deep; at most 64"):
        check_nesting(deep)
    check_nesting(json.dumps({"a": [[{"b": 1}]]}))


def test_value_nesting_walks_parsed_values() -> None:
    value: object = 1
    for _ in range(3000):
        value = {"a": [value]}
    assert value_nesting(value) == 6000
    assert value_nesting({"a": 1, "b": [1, 2]}) == 2
    assert value_nesting("x") == 0
