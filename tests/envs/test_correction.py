"""The capacity correction estimator: recovers known factors, shrinks, ignores an outlier, persists."""

from __future__ import annotations

import json

import numpy as np
import pytest

from atoll.envs.correction import CapacityCorrection, CorrectionSettings
from atoll.solvers.errors import InputError


def _feed(est: CapacityCorrection, truth: dict[str, float], steps: int, rng: np.random.Generator,
          noise: float = 0.01, service: str = "m/decode") -> None:
    fams = sorted(truth)
    for _ in range(steps):
        exposure = {f: float(rng.uniform(100, 1000)) for f in fams if rng.random() < 0.8} or {fams[0]: 500.0}
        implied = sum(v * truth[f] for f, v in exposure.items()) * (1 + noise * rng.standard_normal())
        est.observe(service, exposure, implied, 100.0)


def test_recovers_one_family_within_5_percent_after_an_hour() -> None:
    est = CapacityCorrection()
    _feed(est, {"a": 0.75}, 12, np.random.default_rng(0))
    assert abs(est.factor("a") - 0.75) / 0.75 < 0.05


def test_separates_families_from_mixed_observations() -> None:
    truth = {"a": 0.8, "b": 1.2, "c": 1.0}
    est = CapacityCorrection()
    _feed(est, truth, 48, np.random.default_rng(1))
    for f, k in truth.items():
        assert est.factor(f) == pytest.approx(k, rel=0.05)


def test_thin_evidence_is_shrunk_toward_one_and_unseen_families_stay_one() -> None:
    est = CapacityCorrection(CorrectionSettings(prior_weight=25.0))
    est.observe("m/prefill", {"a": 100.0}, 50.0, weight=25.0)  # one weak interval says half the capacity
    assert est.factor("a") == pytest.approx(0.75)  # as much evidence as the prior: half way
    assert est.factor("never-seen") == 1.0


def test_a_family_keeps_what_was_learned_after_it_leaves() -> None:
    est = CapacityCorrection()
    _feed(est, {"a": 0.6}, 12, np.random.default_rng(4), service="s")
    _feed(est, {"b": 1.2}, 200, np.random.default_rng(5), service="s")
    assert est.factor("a") == pytest.approx(0.6, rel=0.05)
    assert est.factor("b") == pytest.approx(1.2, rel=0.05)


def test_a_lasting_change_is_followed_after_the_second_interval() -> None:
    est = CapacityCorrection()
    _feed(est, {"a": 1.0}, 12, np.random.default_rng(6), noise=0.0)
    est.observe("m/decode", {"a": 100.0}, 60.0, 400.0)  # held back: one interval says 0.6
    assert est.factor("a") == pytest.approx(1.0, abs=0.01) and est.rejected == 1
    est.observe("m/decode", {"a": 100.0}, 60.0, 400.0)  # confirmed: both absorbed
    assert est.factor("a") < 0.9


def test_one_bad_interval_is_ignored() -> None:
    rng = np.random.default_rng(2)
    clean, dirty = CapacityCorrection(), CapacityCorrection()
    _feed(clean, {"a": 0.8}, 12, np.random.default_rng(2))
    _feed(dirty, {"a": 0.8}, 6, rng)
    dirty.observe("m/decode", {"a": 500.0}, 500.0 * 5.0, 100.0)  # a scrape glitch: 5x the capacity
    _feed(dirty, {"a": 0.8}, 6, rng)
    assert dirty.factor("a") == pytest.approx(0.8, rel=0.03)
    assert abs(dirty.factor("a") - clean.factor("a")) < 0.02


def test_bounds_and_unusable_observations() -> None:
    est = CapacityCorrection(CorrectionSettings(low=0.5, high=1.5))
    for _ in range(20):
        est.observe("s", {"a": 100.0}, 10.0, 100.0)
    assert est.factor("a") == 0.5
    assert not est.observe("s", {"a": 100.0}, float("nan"))
    assert not est.observe("s", {}, 100.0)
    assert not est.observe("s", {"a": 100.0}, 100.0, weight=0.0)


def test_state_round_trips_through_json() -> None:
    est = CapacityCorrection()
    _feed(est, {"a": 0.9, "b": 1.1}, 20, np.random.default_rng(3))
    back = CapacityCorrection.from_dict(json.loads(json.dumps(est.as_dict())))
    assert back.factors() == pytest.approx(est.factors())


def test_malformed_state_names_the_part() -> None:
    with pytest.raises(InputError, match="service 's' is malformed"):
        CapacityCorrection.from_dict({"services": {"s": {"families": ["a"], "gram": "x"}}})
    with pytest.raises(InputError, match="half_life"):
        CorrectionSettings(half_life=0)


def test_a_published_factor_moves_at_most_a_bounded_step_per_interval() -> None:
    est = CapacityCorrection(CorrectionSettings(max_step=0.1))
    published = []
    for _ in range(9):  # one strong interval after another says half the capacity
        est.observe("m/decode", {"a": 1000.0}, 500.0, weight=400.0)
        published.append(est.planning_factors()["a"])
    assert published[0] == pytest.approx(1 / 1.1)
    assert all(b / a >= 1 / 1.1 - 1e-12 for a, b in zip([1.0, *published], published, strict=False))
    assert published[-1] == pytest.approx(est.factor("a"), rel=0.05)  # followed within a few intervals


def test_a_factor_fades_toward_the_prior_when_its_evidence_stops() -> None:
    est = CapacityCorrection(CorrectionSettings(half_life=4.0, max_step=1.0))
    for _ in range(3):
        est.observe("m/decode", {"a": 1000.0}, 700.0, weight=400.0)
    learned = est.factor("a")
    for _ in range(40):
        est.fade("m/decode")
    assert learned < est.factor("a") <= 1.0
    assert est.factor("a") == pytest.approx(1.0, abs=0.02)
    est.fade("never/seen")  # nothing to fade: no error


def test_an_estimate_within_its_error_band_is_not_published() -> None:
    banded = CapacityCorrection(CorrectionSettings(publish_band=2.0))
    plain = CapacityCorrection()
    for est in (banded, plain):
        est.observe("m/decode", {"a": 1000.0}, 930.0, weight=25.0)  # one weak interval: -7%
    # the same estimate; only the banded one holds it back (2 standard errors = 0.28 here)
    assert banded.factor("a") == pytest.approx(plain.factor("a"))
    assert "a" in plain.planning_factors() and "a" not in banded.planning_factors()
    with pytest.raises(InputError, match="publish_band"):
        CorrectionSettings(publish_band=-1.0)
