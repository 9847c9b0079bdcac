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

from dataclasses import replace

from atoll.solvers.types import Template

TIERS: tuple[str, ...] = ("on-demand", "spot")
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
