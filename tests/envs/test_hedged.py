"""The hedged market: spot pools beside an on-demand quota, the tier chosen per instance by the
exact ILP (brute force on tiny two-tier instances), preemption of spot only, the tier in plans
and manifests."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "solvers"))
from alloc_instances import brute_force, random_problem  # noqa: E402

from atoll.envs.availability import HedgedAvailability, SpotAvailability, SpotTrace, StaticAvailability  # noqa: E402
from atoll.envs.fleet import FleetState  # noqa: E402
from atoll.solvers.allocation import solve_allocation  # noqa: E402
from atoll.solvers.problem import AllocationProblem, SolveStatus  # noqa: E402
from atoll.solvers.tiers import split_tier, spot_twins, tiered_region  # noqa: E402
from atoll.solvers.types import Phase, Service, Stage, Template  # noqa: E402


def two_tier(seed: int) -> AllocationProblem:
    """A tiny random instance whose every template also exists in its region's spot tier, at
    a seeded discount and with a seeded (small) spot pool beside the on-demand quota."""
    base = random_problem(seed, n_models=1, max_templates=3, avail_max=3, demand_max=20.0)
    rng = random.Random(1000 + seed)
    spot = {(tiered_region(r, "spot"), c): p * rng.choice([0.3, 0.5, 0.8])
            for (r, c), p in base.prices.items()}
    pools = {(tiered_region(r, "spot"), c): rng.randint(0, 1) for (r, c) in base.prices}
    assert base.availability is not None
    return AllocationProblem(base.templates + spot_twins(base.templates), base.demand,
                             {**base.availability, **pools}, {**base.prices, **spot}, gap=0.0)


def test_the_ilp_picks_each_instances_tier_as_brute_force_does() -> None:
    checked = mixed = 0
    for seed in range(80):
        problem = two_tier(seed)
        best = brute_force(problem)
        if best is None or best[0] < 1.0:
            continue  # the demand cannot be met: cost mode is infeasible by design
        res = solve_allocation(problem)
        assert res.status is SolveStatus.OPTIMAL, (seed, res.message)
        assert res.objective == pytest.approx(best[1], abs=1e-6), seed
        assert res.allocation is not None
        tiers = {split_tier(problem.template(k).region)[1] for k, n in res.allocation.counts if n}
        mixed += tiers == {"on-demand", "spot"}
        checked += 1
        if checked >= 12:
            break
    assert checked >= 12 and mixed >= 1  # instances where the optimum needs both tiers


SVC = Service("Phi-4-14B", Phase.DECODE)
OD = Template(SVC, "r", (("1xL4", 1),), (Stage(40, ("1xL4",)),), 100.0)
SPOT = spot_twins([OD])[0]


def test_preemption_hits_spot_instances_only() -> None:
    trace = SpotTrace(values=(16, 0), gap_seconds=300.0, nodes=16, source="test")
    market = HedgedAvailability(StaticAvailability({("r", "1xL4"): 2}),
                                SpotAvailability({(SPOT.region, "1xL4"): 4}, {SPOT.region: trace}))
    market.spot.offsets = {(SPOT.region, "1xL4"): 0.0}
    assert market.capacity(0.0) == {("r", "1xL4"): 2, (SPOT.region, "1xL4"): 4}
    state = FleetState(running={OD.key: 2, SPOT.key: 3})
    lost = state.preempt(market.capacity(300.0), {OD.key: OD, SPOT.key: SPOT}, np.random.default_rng(0))
    assert lost == {SPOT.key: 3} and state.running == {OD.key: 2, SPOT.key: 0}


def test_plans_and_manifests_say_the_tier() -> None:
    from atoll.control.k8s.render import CAPACITY_LABEL, render_manifests
    from atoll.control.plans import PlanRecord
    from atoll.solvers.problem import Allocation

    t = Template(SVC, "aws:us-east-2", (("1xL4", 1),), (Stage(40, ("1xL4",)),), 100.0)
    spot = spot_twins([t])[0]
    record = PlanRecord.from_allocation(1, 0.0, Allocation.of({t.key: 1, spot.key: 2}), None,
                                        {t.key: t, spot.key: spot}, {}, "test")
    described = record.templates[spot.key]
    assert described["region"] == "aws:us-east-2" and described["tier"] == "spot"
    assert "tier" not in record.templates[t.key]  # the fleet's default capacity type
    selectors = {m["metadata"]["annotations"]["atoll.io/template-key"]:
                 m["spec"]["template"]["spec"]["nodeSelector"][CAPACITY_LABEL]
                 for m in render_manifests(record) if m["kind"] == "Deployment"}
    assert selectors == {t.key: "on-demand", spot.key: "spot"}
