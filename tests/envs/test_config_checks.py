"""FleetConfig's field checks: each invalid field is an InputError naming the field, the value and
what is valid; every valid value stays valid."""

import pytest

from atoll.envs.config import FleetConfig
from atoll.forecast.registry import FORECASTERS
from atoll.solvers.errors import InputError


@pytest.mark.parametrize(("field", "value", "message"), [
    ("startup", "slow", "field 'startup' must be one of fixed, sampled, got 'slow'"),
    ("prices", "gold", "field 'prices' must be one of on-demand, spot or None, got 'gold'"),
    ("pd", "split", "field 'pd' must be one of auto, aggregated, disaggregated or None, got 'split'"),
    ("planning_quantile", 0.42, "field 'planning_quantile' must be one of 0.05, 0.1, 0.5"),
    ("step_s", 0, "field 'step_s' must be finite and > 0, got 0"),
    ("drain_s", -1.0, "field 'drain_s' must be finite and >= 0, got -1.0"),
    ("episode_steps", 1.5, "field 'episode_steps' must be an integer, got 1.5"),
    ("demand_seed", -1, "field 'demand_seed' must be >= 0, got -1"),
    ("solver_gap", 1.0, r"field 'solver_gap' must be in \[0, 1\), got 1.0"),
    ("startup_weight", -1.0, "field 'startup_weight' must be finite and >= 0, got -1.0"),
    ("removal_weight", float("nan"), "field 'removal_weight' must be finite and >= 0, got nan"),
    ("days", (5, 4), r"field 'days' must be \(first, last\) with 1 <= first <= last, got \(5, 4\)"),
    ("correction", 1, "field 'correction' must be True or False, got 1"),
])
def test_an_invalid_field_names_itself_its_value_and_what_is_valid(field: str, value: object, message: str
                                                                   ) -> None:
    with pytest.raises(InputError, match=f"FleetConfig: {message}"):
        FleetConfig(**{field: value})  # type: ignore[arg-type]


def test_the_edges_and_the_optional_fields_stay_valid() -> None:
    config = FleetConfig(drain_s=0, removal_weight=0.0, startup_weight=0.0, solver_gap=0.0, demand_seed=0,
                         demand_round=0.0, prices=None, pd=None, episode_steps=1)
    assert config.drain_s == 0 and config.prices is None


def test_a_forecaster_registered_later_is_valid() -> None:
    FORECASTERS["test:later"] = FORECASTERS["naive"]
    try:
        assert FleetConfig(forecaster="test:later").forecaster == "test:later"
    finally:
        del FORECASTERS["test:later"]
