"""The rules' cost-SLO frontier and the contest's headline ratios, as plain arithmetic.

A *point* is a rule's (cost $, SLO attainment) — means over seeds on some days. On the
validation days the frontier is the set of rules no other rule dominates (no more cost and at
least the SLO attainment, one of them strictly); only those rules go on to the test days.

On the test days:

- ``frontier_cost_ratio`` = a learned policy's cost / the frontier's cost at its SLO attainment.
  The frontier's cost there is read piecewise-linearly between the frontier rules' *test-day*
  points, ordered by their test-day SLO attainment. Every frontier rule stays in that line even
  if the test days make it look dominated: dropping it would pick rules on the test days. A
  policy more reliable than every frontier rule is compared with the most reliable rule's cost
  (``position="above"``: the ratio then flatters no one — that rule serves less); one less
  reliable than every frontier rule with the least reliable rule (``position="below"``: that
  rule serves more, so the ratio is lenient on the policy). Both positions are reported.
- ``effective_cost_ratio`` = (node $ + lost-demand $) of the policy / the same of the *best
  rule*: the rule of the grid with the least effective cost on the validation days.
  Lost-demand $ = tokens not served within the SLO x a price per million tokens (by default
  the reward's ``unserved_usd_per_mtok``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from atoll.solvers.errors import InputError
from atoll.solvers.validation import check_number


@dataclass(frozen=True)
class Point:
    """A policy's cost and SLO attainment (and lost tokens, for the effective cost)."""

    name: str
    cost_usd: float
    slo_attainment: float
    unserved_tokens: float = 0.0

    def __post_init__(self) -> None:
        for field in ("cost_usd", "slo_attainment", "unserved_tokens"):
            check_number(f"Point {self.name!r}", field, getattr(self, field), allow_zero=True)

    def effective_cost(self, lost_usd_per_mtok: float) -> float:
        return self.cost_usd + lost_usd_per_mtok * self.unserved_tokens / 1e6


def dominates(a: Point, b: Point) -> bool:
    """a is no more expensive and no less reliable than b, and strictly better in one."""
    return (a.cost_usd <= b.cost_usd and a.slo_attainment >= b.slo_attainment
            and (a.cost_usd < b.cost_usd or a.slo_attainment > b.slo_attainment))


def select_frontier(points: Sequence[Point]) -> list[Point]:
    """The non-dominated points, ordered by SLO attainment (hence by cost). Of identical points
    the first given is kept."""
    if not points:
        raise InputError("select_frontier: no points; run at least one rule")
    kept: list[Point] = []
    for i, p in enumerate(points):
        if any(dominates(q, p) for q in points):
            continue
        if any(q.cost_usd == p.cost_usd and q.slo_attainment == p.slo_attainment for q in points[:i]):
            continue
        kept.append(p)
    return sorted(kept, key=lambda p: (p.slo_attainment, p.cost_usd))


@dataclass(frozen=True)
class FrontierReading:
    """The frontier's cost at an SLO attainment, and where that SLO lies against the frontier."""

    cost_usd: float
    position: str  # "inside", "above" (more reliable than every rule) or "below"
    between: tuple[str, str]  # the two rules read between (the same one twice outside)


def frontier_cost_at(line: Sequence[Point], slo: float) -> FrontierReading:
    """The frontier rules' cost at ``slo``, piecewise-linear between their points ordered by SLO
    attainment (ties by cost), clamped to the end points outside."""
    if not line:
        raise InputError("frontier_cost_at: the frontier is empty")
    pts = sorted(line, key=lambda p: (p.slo_attainment, p.cost_usd))
    lo, hi = pts[0], pts[-1]
    if slo > hi.slo_attainment:
        return FrontierReading(hi.cost_usd, "above", (hi.name, hi.name))
    if slo < lo.slo_attainment:
        return FrontierReading(lo.cost_usd, "below", (lo.name, lo.name))
    for a, b in zip(pts, pts[1:], strict=False):
        if a.slo_attainment <= slo <= b.slo_attainment:
            span = b.slo_attainment - a.slo_attainment
            if span == 0:  # same SLO: the cheaper one (a, by the sort) is the frontier's cost there
                return FrontierReading(a.cost_usd, "inside", (a.name, b.name))
            w = (slo - a.slo_attainment) / span
            return FrontierReading(a.cost_usd + w * (b.cost_usd - a.cost_usd), "inside", (a.name, b.name))
    return FrontierReading(hi.cost_usd, "inside", (hi.name, hi.name))  # slo == the only point's


def best_rule(points: Sequence[Point], lost_usd_per_mtok: float) -> Point:
    """The rule with the least effective cost (ties: the first given)."""
    if not points:
        raise InputError("best_rule: no points")
    return min(points, key=lambda p: p.effective_cost(lost_usd_per_mtok))


@dataclass(frozen=True)
class Headline:
    """One learned policy against the rules on the test days (one seed or the means)."""

    frontier_cost_ratio: float
    frontier_position: str
    frontier_between: tuple[str, str]
    effective_cost_ratio: float
    best_rule: str


def headline(policy: Point, frontier_test: Sequence[Point], best_test: Point,
             lost_usd_per_mtok: float) -> Headline:
    """Both ratios for ``policy`` given the frontier rules' and the best rule's test-day points
    (the rules themselves were chosen on the validation days)."""
    reading = frontier_cost_at(frontier_test, policy.slo_attainment)
    ref = best_test.effective_cost(lost_usd_per_mtok)
    return Headline(
        frontier_cost_ratio=policy.cost_usd / reading.cost_usd if reading.cost_usd > 0 else math.inf,
        frontier_position=reading.position, frontier_between=reading.between,
        effective_cost_ratio=policy.effective_cost(lost_usd_per_mtok) / ref if ref > 0 else math.inf,
        best_rule=best_test.name)


def mean_points(per_seed: Mapping[str, Sequence[Mapping[str, float]]]) -> list[Point]:
    """Points from per-seed totals (``cost_usd``, ``slo_attainment``, ``demand_tokens``,
    ``goodput_tokens``): means over seeds, in the mapping's order."""
    out = []
    for name, rows in per_seed.items():
        n = len(rows)
        if n == 0:
            raise InputError(f"mean_points: rule {name!r} has no runs")
        out.append(Point(name, sum(r["cost_usd"] for r in rows) / n,
                         sum(r["slo_attainment"] for r in rows) / n,
                         sum(max(r["demand_tokens"] - r["goodput_tokens"], 0.0) for r in rows) / n))
    return out


def seed_point(name: str, totals: Mapping[str, float]) -> Point:
    return Point(name, totals["cost_usd"], totals["slo_attainment"],
                 max(totals["demand_tokens"] - totals["goodput_tokens"], 0.0))
