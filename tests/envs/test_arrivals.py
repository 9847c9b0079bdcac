"""Demand sampled from ServeGen-style arrival processes: seeded, unbiased per window, bursty as
the fitted inter-arrival distribution says, and no step a copy of the one before."""

from __future__ import annotations

import numpy as np
import pytest

from atoll.envs.arrivals import GAMMA, IDLE, WEIBULL, ClientWindows, sample_counts
from atoll.envs.config import FleetConfig
from atoll.forecast.workloads import WorkloadError


def clients(rates: np.ndarray, kind: int = GAMMA, cv: float = 2.0) -> ClientWindows:
    """Clients [C, W] with Gamma gaps of coefficient of variation ``cv`` (shape 1/cv^2; the scale
    is irrelevant: gaps are rescaled to fill the window), or Weibull of shape 0.5."""
    shape = np.full(rates.shape, 1.0 / cv**2 if kind == GAMMA else 0.5)
    return ClientWindows(rates, np.full(rates.shape, kind, dtype=np.int8), shape, np.ones(rates.shape))


def test_reproducible_for_a_seed_and_different_across_seeds() -> None:
    w = clients(np.random.default_rng(1).uniform(0, 0.5, (4, 50)))
    a = sample_counts(w, [0, 1, 2, 3], 1.0, 300.0, np.random.default_rng(7))
    assert np.array_equal(a, sample_counts(w, [0, 1, 2, 3], 1.0, 300.0, np.random.default_rng(7)))
    assert not np.array_equal(a, sample_counts(w, [0, 1, 2, 3], 1.0, 300.0, np.random.default_rng(8)))


def test_each_window_gets_its_rate_rounded_stochastically_and_the_mean_is_unbiased() -> None:
    rng = np.random.default_rng(0)
    rates = rng.uniform(0, 0.05, (1, 4000))  # 0-30 requests per window: rounding matters
    counts = sample_counts(clients(rates), [0], 1.0, 60.0, np.random.default_rng(3))
    per_window = counts.reshape(-1, 10).sum(axis=1)
    expected = rates[0] * 600
    assert np.all((per_window == np.floor(expected)) | (per_window == np.ceil(expected)))
    # the mean error: 0 in expectation, sd = sqrt(mean f(1 - f) / W) with f the fractional parts;
    # stated tolerance 4 sd (fails with probability ~6e-5)
    f = expected - np.floor(expected)
    sd = np.sqrt(np.mean(f * (1 - f)) / len(f))
    assert abs(np.mean(per_window - expected)) < 4 * sd


def test_burstier_gaps_give_burstier_minutes_and_no_step_repeats_the_last() -> None:
    rates = np.full((1, 300), 2.0)  # 1200 requests per window
    cv = {}
    for gap_cv in (1.0, 4.0):
        counts = sample_counts(clients(rates, cv=gap_cv), [0], 1.0, 60.0, np.random.default_rng(5))
        cv[gap_cv] = counts.std() / counts.mean()
        assert np.mean(counts[1:] == counts[:-1]) < 0.05  # a held rate repeats in 9 of 10 minutes
    assert cv[4.0] > 2 * cv[1.0]
    weibull = sample_counts(clients(rates, kind=WEIBULL), [0], 1.0, 60.0, np.random.default_rng(5))
    assert weibull.sum() == 1200 * 300 and weibull.std() / weibull.mean() > cv[1.0]


def test_idle_windows_stay_empty_and_a_positive_rate_without_a_fit_is_poisson() -> None:
    w = ClientWindows(np.array([[0.0, 1.0]]), np.array([[IDLE, IDLE]], dtype=np.int8), np.zeros((1, 2)),
                      np.zeros((1, 2)))
    counts = sample_counts(w, [0], 1.0, 300.0, np.random.default_rng(0))
    assert counts[:2].sum() == 0 and counts[2:].sum() == 600


def test_bad_steps_and_settings_are_refused() -> None:
    with pytest.raises(WorkloadError, match="must divide the ServeGen window"):
        sample_counts(clients(np.ones((1, 2))), [0], 1.0, 700.0, np.random.default_rng(0))
    with pytest.raises(ValueError, match="'resample' must be one of sampled, hold"):
        FleetConfig(resample="linear")
    with pytest.raises(ValueError, match="'demand_seed' must be an integer >= 0"):
        FleetConfig(demand_seed=-1)


def test_the_servegen_scenario_series_sampled_and_held() -> None:
    from atoll.envs.demand import workload_series

    models = ("a", "b", "c")
    held = workload_series("servegen", models, 10.0, 300.0, resample="hold")
    one = workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=1)
    again = workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=2)
    for h, s, t in zip(held, one, again, strict=True):
        assert np.mean(h.requests_per_s[1::2] == h.requests_per_s[0::2][: len(h) // 2]) == 1.0
        assert np.mean(s.requests_per_s[1:] == s.requests_per_s[:-1]) < 0.1  # idle windows only
        # the scaled mean survives sampling: within 1% over two weeks
        assert np.mean(s.requests_per_s) == pytest.approx(10.0, rel=0.01)
        assert not np.array_equal(s.requests_per_s, t.requests_per_s)
        np.testing.assert_array_equal(s.input_tokens, h.input_tokens)
