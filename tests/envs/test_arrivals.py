"""Demand sampled from ServeGen-style arrival processes: seeded, unbiased per window, bursty as
the fitted inter-arrival distribution says, and no step a copy of the one before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from arrivals_oracle import oracle_counts
from scipy import stats

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
    with pytest.raises(ValueError, match="'demand_seed' must be >= 0"):
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


def _same_distribution(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of a chi-square test that two samples of counts share a distribution (bins cut at
    the pooled sample's quantiles, so every bin holds enough of both)."""
    pooled = np.concatenate([a, b])
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, 11)))
    if len(edges) < 3:  # (nearly) constant counts: compare the values' frequencies directly
        values = np.unique(pooled)
        table = np.array([[np.sum(x == v) for v in values] for x in (a, b)])
    else:
        table = np.array([np.histogram(x, bins=edges)[0] for x in (a, b)])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 1.0
    return float(stats.chi2_contingency(table)[1])


# (kind, gap shape, rate req/s, step s): bursty and regular Gamma, a window with no fit
# (Poisson), Weibull, and a very bursty Gamma at a high rate (the bridge's deep searches)
CASES = [(GAMMA, 0.3, 0.5, 300.0), (GAMMA, 3.0, 0.05, 60.0), (IDLE, 0.0, 0.2, 120.0),
         (WEIBULL, 0.6, 0.3, 60.0), (GAMMA, 0.05, 3.0, 60.0)]


@pytest.mark.parametrize(("kind", "shape", "rate", "step_s"), CASES)
def test_the_sampler_matches_the_explicit_one_in_distribution(kind: int, shape: float, rate: float,
                                                              step_s: float) -> None:
    windows = 1500  # iid windows: each one a draw of the vector of its steps' counts
    w = ClientWindows(np.full((1, windows), rate), np.full((1, windows), kind, dtype=np.int8),
                      np.full((1, windows), shape), np.ones((1, windows)))
    k = int(600 / step_s)
    got = sample_counts(w, [0], 1.0, step_s, np.random.default_rng(11)).reshape(windows, k)
    ref = oracle_counts(w, [0], 1.0, step_s, np.random.default_rng(12)).reshape(windows, k)
    # every step's count, and the running totals (the joint placement within a window)
    # alpha 1e-4 per comparison: about 2e-3 over the 2k comparisons of a case
    for j in range(k):
        assert _same_distribution(got[:, j], ref[:, j]) > 1e-4, f"step {j}"
        assert _same_distribution(got[:, : j + 1].sum(axis=1), ref[:, : j + 1].sum(axis=1)) > 1e-4
    # neighbouring steps covary the same way (Fisher z-test of the two correlations; with two
    # steps their sum is the window's count, checked above)
    if k > 2:
        r = [np.corrcoef(x[:, 0], x[:, 1])[0, 1] for x in (got, ref)]
        z = (np.arctanh(r[0]) - np.arctanh(r[1])) / np.sqrt(2.0 / (windows - 3))
        assert abs(z) < 4.0


def test_poisson_windows_split_binomially() -> None:
    # Exponential gaps rescaled to the window: the requests before the last are uniform order
    # statistics and the last ends the window, so the first of two steps holds Binomial(n - 1, 1/2)
    n, windows = 40, 4000
    w = ClientWindows(np.full((1, windows), n / 600), np.full((1, windows), IDLE, dtype=np.int8),
                      np.zeros((1, windows)), np.zeros((1, windows)))
    first = sample_counts(w, [0], 1.0, 300.0, np.random.default_rng(2)).reshape(windows, 2)[:, 0]
    observed = np.bincount(first, minlength=n)[:n]
    expected = stats.binom.pmf(np.arange(n), n - 1, 0.5) * windows
    keep = expected >= 5  # chi-square over the cells it is valid for, the tails pooled
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3


def test_a_lone_request_ends_its_window() -> None:
    w = ClientWindows(np.full((1, 3), 1 / 600), np.array([[GAMMA, WEIBULL, IDLE]], dtype=np.int8),
                      np.full((1, 3), 0.5), np.ones((1, 3)))
    counts = sample_counts(w, [0], 1.0, 120.0, np.random.default_rng(0)).reshape(3, 5)
    np.testing.assert_array_equal(counts, [[0, 0, 0, 0, 1]] * 3)


def test_many_clients_sum_and_an_empty_client_list_is_all_zero() -> None:
    rng = np.random.default_rng(4)
    w = ClientWindows(rng.uniform(0, 0.2, (6, 40)), rng.integers(0, 3, (6, 40)).astype(np.int8),
                      rng.uniform(0.2, 2.0, (6, 40)), np.ones((6, 40)))
    total = sample_counts(w, range(6), 1.0, 300.0, np.random.default_rng(1))
    assert total.shape == (80,) and total.sum() > 0
    assert not sample_counts(w, [], 1.0, 300.0, np.random.default_rng(1)).any()


def test_sampled_series_are_cached_on_disk_and_loaded_not_sampled_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from atoll.envs import demand

    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))
    models = ("a", "b")
    demand._named_series.cache_clear()
    first = demand.workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=3)
    (path,) = (tmp_path / "demand").glob("*.npz")

    def no_sampling(*args: object, **kwargs: object) -> None:
        raise AssertionError("sampled again instead of loading the cache")

    monkeypatch.setattr(demand, "sample_counts", no_sampling)
    demand._named_series.cache_clear()
    again = demand.workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=3)
    for a, b in zip(first, again, strict=True):
        assert a.name == b.name and a.step_s == b.step_s
        for field in ("requests_per_s", "input_tokens", "output_tokens"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    # another seed is another file; a damaged file is sampled again, with a warning
    monkeypatch.undo()
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))
    demand._named_series.cache_clear()
    demand.workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=4)
    assert len(list((tmp_path / "demand").glob("*.npz"))) == 2
    path.write_bytes(path.read_bytes()[:100])
    demand._named_series.cache_clear()
    with caplog.at_level("WARNING"):
        redone = demand.workload_series("servegen", models, 10.0, 300.0, resample="sampled", seed=3)
    assert "demand cache" in caplog.text
    np.testing.assert_array_equal(redone[0].requests_per_s, first[0].requests_per_s)  # same seed, same draws
    demand._named_series.cache_clear()
