"""The frontier and the headline ratios on hand-made points (every expected number computed by hand)."""

from __future__ import annotations

import pytest

from atoll.solvers.errors import InputError
from atoll.training.frontier import (
    Point,
    best_rule,
    frontier_cost_at,
    headline,
    select_frontier,
)

POINTS = [
    Point("a", 100.0, 0.80, 4e6),
    Point("b", 120.0, 0.90, 2e6),
    Point("c", 130.0, 0.85, 3e6),   # dominated by b (costlier, less reliable)
    Point("d", 160.0, 0.95, 1e6),
    Point("e", 100.0, 0.78, 5e6),   # dominated by a (same cost, less reliable)
    Point("f", 200.0, 0.95, 0.0),   # dominated by d (same SLO, costlier)
    Point("g", 90.0, 0.70, 9e6),
    Point("b2", 120.0, 0.90, 2e6),  # identical to b: the first one given is kept
]


def test_dominated_points_are_dropped_and_the_rest_ordered_by_slo() -> None:
    assert [p.name for p in select_frontier(POINTS)] == ["g", "a", "b", "d"]


def test_interpolation_by_hand() -> None:
    line = select_frontier(POINTS)
    # between b (0.90, 120) and d (0.95, 160): at 0.92, 120 + 0.4 x 40 = 136
    r = frontier_cost_at(line, 0.92)
    assert r.cost_usd == pytest.approx(136.0) and r.position == "inside" and r.between == ("b", "d")
    # between g (0.70, 90) and a (0.80, 100): at 0.75, 95
    assert frontier_cost_at(line, 0.75).cost_usd == pytest.approx(95.0)
    # on a rule's point exactly
    assert frontier_cost_at(line, 0.90).cost_usd == pytest.approx(120.0)
    # beyond the most reliable rule: its cost, flagged; below the least reliable: its cost, flagged
    above = frontier_cost_at(line, 0.99)
    assert (above.cost_usd, above.position, above.between) == (160.0, "above", ("d", "d"))
    below = frontier_cost_at(line, 0.5)
    assert (below.cost_usd, below.position) == (90.0, "below")


def test_test_day_points_out_of_order_still_interpolate_through_every_frontier_rule() -> None:
    # On the test days rule b is now more reliable than d: the line is read in SLO order, nothing dropped.
    line = [Point("b", 150.0, 0.96), Point("d", 140.0, 0.94)]
    r = frontier_cost_at(line, 0.95)
    assert r.cost_usd == pytest.approx(145.0) and r.between == ("d", "b")


def test_headline_ratios_by_hand() -> None:
    line = select_frontier(POINTS)
    lost = 10.0  # $ per million tokens lost
    # best rule by effective cost: g 90+90=180, a 100+40=140, b 120+20=140 (a first), d 160+10=170
    assert best_rule(line, lost).name == "a"
    policy = Point("learned", 130.0, 0.92, 1.5e6)
    h = headline(policy, line, best_rule(line, lost), lost)
    assert h.frontier_cost_ratio == pytest.approx(130.0 / 136.0)
    assert h.effective_cost_ratio == pytest.approx((130.0 + 15.0) / 140.0)
    assert h.frontier_position == "inside" and h.best_rule == "a"


def test_bad_points_and_empty_sets_are_refused() -> None:
    with pytest.raises(InputError, match="slo_attainment"):
        Point("x", 1.0, float("nan"))
    with pytest.raises(InputError, match="no points"):
        select_frontier([])
    with pytest.raises(InputError, match="empty"):
        frontier_cost_at([], 0.9)
