"""Every planning level the forecasters provide is a valid planning quantile of the env."""

from __future__ import annotations

import pytest

from atoll.envs.config import FleetConfig
from atoll.forecast.forecasters import PLANNING_LEVELS


@pytest.mark.parametrize("q", PLANNING_LEVELS)
def test_fleet_config_accepts_every_planning_level(q: float) -> None:
    assert FleetConfig(planning_quantile=q).planning_quantile == q


def test_fleet_config_rejects_a_level_not_forecast() -> None:
    with pytest.raises(ValueError, match="'planning_quantile'"):
        FleetConfig(planning_quantile=0.42)
