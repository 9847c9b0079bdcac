"""``peak:learned``: its features, network, conformal layer, training and shipped weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atoll.forecast.forecasters import DAY, ForecastError
from atoll.forecast.learned import (
    LAGS,
    N_FEATURES,
    SHIPPED,
    DemandNet,
    PeakLearned,
    features,
    load_net,
    training_rows,
)
from atoll.forecast.learned_fit import FitSettings, fit_net
from atoll.forecast.registry import make_forecaster
from atoll.forecast.synthetic import synthetic_series


def random_net(seed: int, horizon: int = 3, hidden: int = 8) -> DemandNet:
    rng = np.random.default_rng(seed)
    layers = ((rng.normal(0, 0.3, (N_FEATURES, hidden)), rng.normal(0, 0.1, hidden)),
              (rng.normal(0, 0.3, (hidden, 2 * horizon)), rng.normal(0, 0.1, 2 * horizon)))
    return DemandNet(layers, horizon, {}, digest="test")


def test_the_vectorized_rows_are_the_features_one_step_at_a_time() -> None:
    y = synthetic_series("pareto-bursts", days=3, seed=4)
    origins = np.array([DAY + LAGS, DAY + 100, 2 * DAY + 7, 3 * DAY - 3])
    x, peaks = training_rows(y, origins)
    for row, t in enumerate(origins):
        np.testing.assert_allclose(x[row], features(y[:t]), rtol=1e-12)
        level = max(y[t - DAY:t].mean(), y[t - LAGS:t].mean())
        np.testing.assert_allclose(peaks[row], np.maximum.accumulate(y[t:t + 3]) / level, rtol=1e-12)
    with pytest.raises(ForecastError, match="origins must lie in"):
        training_rows(y, np.array([10]))


def test_quantiles_never_cross_and_peaks_never_shrink_with_the_look_ahead() -> None:
    out = random_net(1).predict(np.random.default_rng(2).normal(0, 3, (500, N_FEATURES)))
    assert out.shape == (500, 3, 2)
    assert np.all(out[:, :, 1] >= out[:, :, 0])
    assert np.all(np.diff(out, axis=1) >= 0)


def test_the_conformal_layer_holds_coverage_even_for_an_untrained_network() -> None:
    # a random network's quantiles mean nothing; adaptive conformal inference still brings the
    # share of peaks at or below the issued 0.9 quantile to 0.9 over the days
    y = synthetic_series("smooth-daily", days=10, seed=1)
    f = PeakLearned(DAY, 3, net=random_net(3)).fit(y[:3 * DAY])
    for v in y[3 * DAY:]:
        fc = f.forecast(3)
        assert np.all(fc.quantile(0.9) >= fc.quantile(0.5)) and np.all(np.diff(fc.quantile(0.9)) >= 0)
        f.update(v)
    assert 0.85 <= f.coverage(0.9) <= 0.95


def test_training_is_deterministic_and_reads_no_test_day(tmp_path: Path) -> None:
    extra = tuple((f"synthetic/{n}", tuple(synthetic_series(n, days=14, seed=0)))
                  for n in ("smooth-daily", "pareto-bursts"))
    st = FitSettings(scenarios=(), extra=extra, epochs=2, hidden=8, batch_size=256)
    net, report = fit_net(st)
    again, _ = fit_net(st)
    for (w, b), (w2, b2) in zip(net.layers, again.layers, strict=True):
        np.testing.assert_array_equal(w, w2)
        np.testing.assert_array_equal(b, b2)
    # days 11-14 changed: the same weights (the series are cut at day 10)
    cut = tuple((n, v[: 10 * DAY] + tuple(np.full(4 * DAY, 1e6))) for n, v in extra)
    other, _ = fit_net(FitSettings(scenarios=(), extra=cut, epochs=2, hidden=8, batch_size=256))
    np.testing.assert_array_equal(other.layers[0][0], net.layers[0][0])
    assert report["fit_days"] == [2, 7] and report["validation_days"] == [8, 10]
    loaded = load_net(net.save(tmp_path / "w.npz"))
    x = np.random.default_rng(0).normal(size=(5, N_FEATURES))
    np.testing.assert_allclose(loaded.predict(x), net.predict(x))


def test_bad_weights_and_settings_are_named(tmp_path: Path) -> None:
    with pytest.raises(ForecastError, match=r"weights not found at .*nowhere.npz.*atoll forecast train"):
        load_net(tmp_path / "nowhere.npz")
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ForecastError, match="not a peak:learned weights file"):
        load_net(tmp_path / "junk.npz")
    with pytest.raises(ForecastError, match="field 'epochs'"):
        FitSettings(epochs=0)
    with pytest.raises(ForecastError, match="must not be empty"):
        FitSettings(scenarios=())


def test_the_shipped_weights_make_the_named_forecaster() -> None:
    assert SHIPPED.is_file()
    net = load_net()
    assert net.card["validation_days"] == [8, 10] and net.card["data_hash"]
    f = make_forecaster("peak:learned", DAY, horizon=3)
    assert isinstance(f, PeakLearned) and f.name == "peak:learned"
    y = synthetic_series("weekly", days=5, seed=0)
    f.fit(y[:3 * DAY])
    f.update(y[3 * DAY:4 * DAY])
    q = f.forecast(3).quantile(0.9)
    assert q.shape == (3,) and np.all(np.isfinite(q)) and np.all(q >= 0)
