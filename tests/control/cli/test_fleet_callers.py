"""The CLI (``fleet_market``), the simulator's configuration (``fleet_config``) and the live
controller (``live_fleet``) run a fleet file under what ``FleetSpec.market_choice`` decides, for
every (availability, prices) asked for, and refuse the same inputs."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from test_market import spot_fleet

from atoll.control import live_fleet as live_module
from atoll.control.cli.common import fleet_market
from atoll.control.cli.output import UserError
from atoll.envs.fleet_file import Fleet, fleet_config, read_fleet
from atoll.solvers.fleet import MARKET_CHOICES, PRICE_LISTS, STATIC_CHOICES, MarketChoiceError

INPUTS = [(a, p) for a in (None, *MARKET_CHOICES, *STATIC_CHOICES) for p in (None, *PRICE_LISTS)]
LIVE_INPUTS = [(m, p) for m in (None, *MARKET_CHOICES) for p in (None, *PRICE_LISTS)]


@pytest.fixture(scope="module")
def active(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return read_fleet(spot_fleet(tmp_path_factory.mktemp("fleet")))


@pytest.mark.parametrize(("availability", "prices"), INPUTS)
def test_the_cli_and_the_simulator_run_what_the_rule_says(active: Fleet, availability: str | None,
                                                          prices: str | None,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    given = {k: v for k, v in (("availability", availability), ("prices", prices)) if v is not None}
    args = argparse.Namespace(availability=availability, prices=prices)
    try:
        choice = active.spec.market_choice(availability, prices)
    except MarketChoiceError as refusal:
        with pytest.raises(UserError) as said:
            fleet_market(args, active)
        assert str(said.value) == refusal.said("--availability", "--prices")
        with pytest.raises(MarketChoiceError) as config_refusal:
            fleet_config(active, (4, 4), **given)
        assert str(config_refusal.value) == str(refusal)
        return
    assert fleet_market(args, active) == choice.availability
    err = capsys.readouterr().err
    assert (f"--availability {choice.availability} overrides the fleet file's market (spot)" in err) \
        == choice.overrides
    config = fleet_config(active, (4, 4), **given)
    assert (config.availability, config.prices) == (choice.availability, choice.prices)
    # what make_env does: the CLI's availability and --prices on to the simulator's configuration
    config = fleet_config(active, (4, 4), availability=fleet_market(args, active), prices=prices)
    assert (config.availability, config.prices) == (choice.availability, choice.prices)


@pytest.mark.parametrize(("market", "prices"), LIVE_INPUTS)
def test_the_live_controller_plans_what_the_rule_says(active: Fleet, market: str | None, prices: str | None,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []
    monkeypatch.setattr(live_module, "LiveFleet", lambda scenario, **kw: built.append(kw))
    given = {k: v for k, v in (("market", market), ("prices", prices)) if v is not None}
    try:
        choice = active.spec.market_choice(market, prices, prices_pick_market=True)
    except MarketChoiceError as refusal:
        with pytest.raises(MarketChoiceError) as live_refusal:
            live_module.live_fleet(active, **given)
        assert str(live_refusal.value) == str(refusal) and not built
        return
    live_module.live_fleet(active, **given)
    (kw,) = built
    assert kw["market"] == choice.market
    if choice.market is None:  # one tier at the file's static caps (ample where it names none)
        assert (choice.availability, kw["prices"]) == ("ample", choice.prices)
        assert kw["availability"] == active.spec.availability
    else:
        assert "availability" not in kw
    # the one difference from the CLI: a price list alone picks the market instead of being refused
    if market is None and prices is not None:
        with pytest.raises(MarketChoiceError):
            active.spec.market_choice(market, prices)


def test_live_refuses_a_market_that_is_no_market_kind(active: Fleet) -> None:
    with pytest.raises(ValueError, match="field 'market' must be one of spot, hedged, market or None"):
        live_module.live_fleet(active, market="ample")
