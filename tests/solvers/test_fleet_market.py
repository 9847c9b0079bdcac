"""The one rule of which market a fleet's pools run in and which price list applies
(``FleetSpec.market_choice``), over every (availability, prices) a caller may ask for."""

from __future__ import annotations

import pickle

import pytest
import yaml

from atoll.solvers.fleet import (
    MARKET_CHOICES,
    PRICE_LISTS,
    STATIC_CHOICES,
    FleetFileError,
    FleetSpec,
    MarketChoice,
    MarketChoiceError,
    load_fleet,
)

# a fleet of two markets: a catalog region on-demand, a lab rack on spot
DOC = {"name": "acme", "models": ["Phi-4-14B"],
       "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4"]},
                   {"name": "lab:rack-1", "market": "spot",
                    "offers": [{"config": "8xMI300X", "on_demand": 28.0, "spot": 11.0}]}],
       "gpus": [{"name": "MI300X", "memory_gb": 192, "hbm_bandwidth_gbs": 5300, "bf16_tflops": 1307,
                 "link_gbs": 448}],
       "workloads": {"Phi-4-14B": {"source": "servegen:m-large", "mean_rate": 2.0}}}
REFUSED = "refused"

# (availability, prices) -> (availability, prices) the fleet runs under, or REFUSED; None: not given
TABLE: list[tuple[str | None, str | None, tuple[str, str | None] | str]] = [
    (None, None, ("market", None)),
    (None, "on-demand", REFUSED),
    (None, "spot", REFUSED),
    ("market", None, ("market", None)),
    ("market", "on-demand", REFUSED),
    ("market", "spot", REFUSED),
    ("spot", None, ("spot", None)),
    ("spot", "on-demand", REFUSED),
    ("spot", "spot", REFUSED),
    ("hedged", None, ("hedged", None)),
    ("hedged", "on-demand", REFUSED),
    ("hedged", "spot", REFUSED),
    ("ample", None, ("ample", None)),
    ("ample", "on-demand", ("ample", "on-demand")),
    ("ample", "spot", ("ample", "spot")),
    ("scarce", None, ("scarce", None)),
    ("scarce", "on-demand", ("scarce", "on-demand")),
    ("scarce", "spot", ("scarce", "spot")),
]
# the live controller takes no availability: a price list alone picks the market there
Expected = tuple[str, str | None] | str
PICKED: dict[tuple[str | None, str | None], Expected] = {(None, "spot"): ("spot", None),
                                                         (None, "on-demand"): ("ample", "on-demand")}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> FleetSpec:
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_text(yaml.safe_dump(DOC))
    return load_fleet(path)


def test_the_table_covers_every_input() -> None:
    asked = {(a, p) for a, p, _ in TABLE}
    assert asked == {(a, p) for a in (None, *MARKET_CHOICES, *STATIC_CHOICES) for p in (None, *PRICE_LISTS)}
    assert len(asked) == len(TABLE)


@pytest.mark.parametrize("pick", [False, True], ids=["cli-and-simulator", "live"])
@pytest.mark.parametrize(("availability", "prices", "expected"), TABLE)
def test_the_rule_over_every_input(spec: FleetSpec, availability: str | None, prices: str | None,
                                   expected: tuple[str, str | None] | str, pick: bool) -> None:
    if pick:
        expected = PICKED.get((availability, prices), expected)
    if expected == REFUSED:
        with pytest.raises(MarketChoiceError) as caught:
            spec.market_choice(availability, prices, prices_pick_market=pick)
        assert isinstance(caught.value, FleetFileError)
        assert caught.value.availability == availability and caught.value.prices == prices
        return
    choice = spec.market_choice(availability, prices, prices_pick_market=pick)
    assert (choice.availability, choice.prices) == expected
    assert choice.market == (choice.availability if choice.availability in MARKET_CHOICES else None)
    assert choice.overrides == (choice.availability != "market")
    # asking again for what was chosen gives it back: the callers may pass a choice on
    again = spec.market_choice(choice.availability, choice.prices, prices_pick_market=pick)
    assert again == choice


def test_refusals_name_the_file_the_values_and_the_fix(spec: FleetSpec) -> None:
    with pytest.raises(MarketChoiceError) as caught:
        spec.market_choice(None, "on-demand")
    text = str(caught.value)
    assert text.startswith(f"{spec.path}: prices on-demand: the fleet file's market bills each pool at its "
                           f"own tier (mixed (on-demand, spot))")
    assert "drop prices, or override the market with availability ample|scarce|spot|hedged" in text
    # in a caller's words: the CLI's flags
    assert caught.value.said("--availability", "--prices") == (
        "--prices on-demand: the fleet file's market bills each pool at its own tier (mixed (on-demand, "
        "spot)); drop --prices, or override the market with --availability ample|scarce|spot|hedged")
    with pytest.raises(MarketChoiceError) as caught:
        spec.market_choice("hedged", "spot")
    assert "prices spot does not apply to availability hedged" in str(caught.value)
    assert "drop prices, or use availability ample or scarce" in str(caught.value)
    assert caught.value.said("--availability", "--prices").startswith(
        "--prices spot does not apply to --availability hedged (each pool bills at the tier that serves it)")


def test_a_refusal_survives_a_trip_to_a_worker(spec: FleetSpec) -> None:
    with pytest.raises(MarketChoiceError) as caught:
        spec.market_choice("spot", "on-demand")
    back = pickle.loads(pickle.dumps(caught.value))
    assert str(back) == str(caught.value) and back.said("A", "P") == caught.value.said("A", "P")


@pytest.mark.parametrize(("availability", "prices", "message"), [
    ("plenty", None, "availability 'plenty' is not a kind; valid: market, spot, hedged, ample, scarce"),
    ("ample", "reserved", "prices 'reserved' is not a price list; valid: on-demand, spot"),
])
def test_unknown_kinds_are_refused_with_the_valid_ones(spec: FleetSpec, availability: str, prices: str | None,
                                                       message: str) -> None:
    for pick in (False, True):
        with pytest.raises(FleetFileError, match=message) as caught:
            spec.market_choice(availability, prices, prices_pick_market=pick)
        assert not isinstance(caught.value, MarketChoiceError) and str(spec.path) in str(caught.value)


def test_the_kinds_are_the_simulators() -> None:
    """The bottom layer names the simulator's kinds itself; they stay the same ones."""
    from atoll.envs.config import AVAILABILITY_KINDS, MARKET_KINDS, PRICE_KINDS

    assert set(MARKET_CHOICES) == set(MARKET_KINDS)
    assert set(MARKET_CHOICES + STATIC_CHOICES) == set(AVAILABILITY_KINDS)
    assert PRICE_LISTS == PRICE_KINDS
    assert MarketChoice("ample", "spot").market is None and MarketChoice("hedged").market == "hedged"
