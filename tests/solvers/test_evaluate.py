import pytest
from alloc_instances import template

from atoll.solvers.allocation.evaluate import evaluate_plan
from atoll.solvers.problem import Allocation, AllocationProblem
from atoll.solvers.types import Phase

R = "r1"
PRE = template("m", Phase.PREFILL, R, {"1xA": 1}, 10.0)
DEC = template("m", Phase.DECODE, R, {"1xA": 1, "1xB": 1}, 4.0)
OTHER = template("n", Phase.DECODE, R, {"1xB": 2}, 6.0)
PRICES = {(R, "1xA"): 1.0, (R, "1xB"): 3.0}


def _problem(**kw) -> AllocationProblem:
    return AllocationProblem((PRE, DEC, OTHER), {"m/prefill": 20.0, "m/decode": 8.0, "n/decode": 6.0},
                             {(R, "1xA"): 4, (R, "1xB"): 4}, PRICES, **kw)


def test_cost_served_and_shares_by_hand():
    ev = evaluate_plan(_problem(), Allocation.of({PRE.key: 2, DEC.key: 1, OTHER.key: 1}))
    assert ev.cost_per_hour == pytest.approx(2 * 1 + (1 + 3) + 2 * 3)
    assert ev.served == {"m/prefill": 20.0, "m/decode": 4.0, "n/decode": 6.0}
    assert ev.served_share == {"m": pytest.approx(0.5), "n": pytest.approx(1.0)}  # a request needs both
    assert ev.goodput_fraction == pytest.approx(0.75)
    assert not ev.feasible and any("m/decode" in v for v in ev.violations)  # cost mode: demand unmet
    assert evaluate_plan(_problem(mode="goodput"), Allocation.of({PRE.key: 2, DEC.key: 1})).feasible


def test_violations_are_named():
    ev = evaluate_plan(_problem(mode="goodput"), {PRE.key: 1.5, DEC.key: -1, "nope": 1, OTHER.key: 3})
    text = " | ".join(ev.violations)
    assert "not an integer" in text and "negative" in text and "unknown template key" in text
    assert "1xB: uses 5 nodes, 4 available" in text  # -1 x 1 + 3 x 2


def test_fixed_models_and_startup_cost():
    running = Allocation.of({OTHER.key: 1, PRE.key: 1})
    p = _problem(running=running, reoptimize=frozenset({"m"}), startup_weight=0.5)
    ev = evaluate_plan(p, Allocation.of({PRE.key: 2, DEC.key: 2, OTHER.key: 1}))
    assert ev.feasible, ev.violations
    assert ev.startup_cost_per_hour == pytest.approx(1 + 2 * 4)
    assert ev.objective == pytest.approx(ev.cost_per_hour + 0.5 * 9)
    ev = evaluate_plan(p, Allocation.of({PRE.key: 2, DEC.key: 2, OTHER.key: 2}))
    assert any("held fixed" in v for v in ev.violations)


def test_one_gpu_type_rule():
    p = _problem(mode="goodput", one_gpu_type_per_model=True)
    ev = evaluate_plan(p, Allocation.of({PRE.key: 1, DEC.key: 1}))
    assert any("GPU types ['A', 'B']" in v for v in ev.violations)
