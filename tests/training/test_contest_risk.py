"""The contest's grid with the risk lever: ContestSettings crosses its rules with a risk menu,
refuses a malformed one, and the per-model reference takes the rules' risk twins as options too."""

from __future__ import annotations

import pytest

from atoll.envs.vocabulary import parse_policy
from atoll.solvers.errors import InputError
from atoll.training.contest import ContestSettings, reference_rule
from atoll.training.per_model import frontier_targets


def test_the_settings_cross_the_grid_with_the_risk_menu() -> None:
    st = ContestSettings(levels=(0.9,), intervals=(1, 3), bands=(), risks=("neutral", "h0.85", "h0.7"))
    assert st.grid == ["fixed:1@0.9", "fixed:3@0.9", "fixed:1@0.9+h0.85", "fixed:3@0.9+h0.85",
                       "fixed:1@0.9+h0.7", "fixed:3@0.9+h0.7"]
    assert ContestSettings(levels=(0.9,), intervals=(1,), bands=()).grid == ["fixed:1@0.9"]
    # the SLO a learned policy must keep is still the neutral fixed:1@0.9's
    assert [str(s) for s in st.rules] == st.grid
    assert reference_rule(st.rules) == parse_policy("fixed:1@0.9")


@pytest.mark.parametrize("risks", [("neutral", "h2"), ("h0.7", "h0.7"), ("q0.5",)])
def test_a_bad_risk_menu_is_an_error(risks: tuple[str, ...]) -> None:
    with pytest.raises(InputError):
        ContestSettings(levels=(0.9,), intervals=(1,), bands=(), risks=risks)


def test_per_model_targets_take_the_rules_with_a_risk_too() -> None:
    frontier = [(parse_policy(n), slo) for n, slo in
                (("fixed:1@0.9", 0.90), ("fixed:1@0.9+h0.7", 0.95), ("fixed:3@0.9", 0.85))]
    assert [str(n) for n, _ in frontier_targets(frontier, 3)] == ["fixed:3@0.9", "fixed:1@0.9",
                                                                 "fixed:1@0.9+h0.7"]
    # the SLO reference stays a rule of the configured risk, even when the grid lacks fixed:1@0.9
    assert reference_rule([parse_policy("fixed:1@0.9+h0.7"), parse_policy("fixed:3@0.9")]) == \
        parse_policy("fixed:3@0.9")
