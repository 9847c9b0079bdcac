"""Price tiers of a market cell: on-demand and spot capacity of one (region, config).

A ``hedged`` market offers both tiers of every (region, config). The allocation ILP needs no
tier concept of its own: the spot tier of a region is a *tiered region* name
(``"aws:us-east-2~spot"``), its templates are the region's templates re-homed there, and its
prices and availability are keyed by ``(tiered region, config)``. The ILP's instance variables
per (template, region) then are variables per (template, region, tier), and its per-cell
availability rows bound each tier's pool on its own. :func:`split_tier` recovers the plain
region and the tier wherever a plan is shown or deployed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from atoll.solvers.types import Pool, Template

TIERS: tuple[str, ...] = ("on-demand", "spot")
MARKETS: tuple[str, ...] = ("on-demand", "spot", "hedged")
_TAG = "~"


def tiered_region(region: str, tier: str) -> str:
    """The region name that carries ``tier`` (on-demand keeps the plain name)."""
    if tier not in TIERS:
        raise ValueError(f"unknown price tier {tier!r}; valid: {', '.join(TIERS)}")
    return region if tier == "on-demand" else f"{region}{_TAG}{tier}"


def split_tier(region: str, default: str = "on-demand") -> tuple[str, str]:
    """(plain region, tier) of a possibly tiered region name; untagged names get ``default``."""
    base, sep, tier = region.partition(_TAG)
    return (base, tier) if sep else (region, default)


def spot_twins(templates: tuple[Template, ...] | list[Template]) -> tuple[Template, ...]:
    """Each template re-homed in its region's spot tier."""
    return tuple(replace(t, region=tiered_region(t.region, "spot")) for t in templates)


def tiers_of(market: str) -> tuple[str, ...]:
    """The price tiers a pool of ``market`` sells: on-demand, spot, or both (hedged)."""
    if market not in MARKETS:
        raise ValueError(f"unknown market {market!r}; valid: {', '.join(MARKETS)}")
    return TIERS if market == "hedged" else (market,)


def market_tiers(templates: Sequence[Template], markets: Mapping[Pool, str],
                 on_demand: Mapping[Pool, float], spot: Mapping[Pool, float],
                 ) -> tuple[tuple[Template, ...], dict[Pool, float]]:
    """Templates and prices of a market per pool (cells left out of ``markets`` are on-demand):
    a template keeps its plain region where every pool it uses sells on-demand, and gets a spot
    twin where every pool it uses sells spot; each tier's cell is priced at its tier's price.
    Spot-only pools then have no on-demand templates at all, so nothing can be billed there at
    the wrong tier."""

    def sells(t: Template, tier: str) -> bool:
        return all(tier in tiers_of(markets.get((t.region, c), "on-demand")) for c, _ in t.node_use)

    plain = tuple(t for t in templates if sells(t, "on-demand"))
    twins = spot_twins([t for t in templates if sells(t, "spot")])
    prices: dict[Pool, float] = {}
    for cell, price in on_demand.items():
        tiers = tiers_of(markets.get(cell, "on-demand"))
        if "on-demand" in tiers:
            prices[cell] = price
        if "spot" in tiers:
            prices[(tiered_region(cell[0], "spot"), cell[1])] = spot[cell]
    return plain + twins, prices
