"""The forecast cache is checksummed: a truncated or edited file is rebuilt with a warning."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from atoll.envs.demand import build_book
from atoll.forecast.workloads import DemandSeries


def series(name: str, seed: int) -> DemandSeries:
    rng = np.random.default_rng(seed)
    n = 5 * 72  # five days of 20-minute steps (the intervals need a day of calibration)
    rates = 5 + 3 * np.sin(np.arange(n) * 2 * np.pi / 72) + rng.uniform(0, 1, n)
    return DemandSeries(name, 1200.0, rates, np.full(n, 100.0), np.full(n, 10.0))


@pytest.mark.parametrize("damage", ["truncate", "edit"])
def test_a_damaged_forecast_cache_is_rebuilt_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture,
                                                            damage: str) -> None:
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))
    args = (["a", "b"], [series("a", 1), series("b", 2)])
    kwargs = {"forecaster": "naive", "horizon": 3, "quantile": 0.9}
    first = build_book(*args, **kwargs)
    (path,) = (tmp_path / "forecasts").glob("*.npz")
    raw = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(raw[: len(raw) // 2])
    else:  # valid arrays with other numbers: only the checksum tells
        with np.load(path) as doc:
            arrays = {k: doc[k] for k in doc.files}
        arrays["a2"] = arrays["a2"] * 2  # the upper quantile
        np.savez_compressed(path, **arrays)
    with caplog.at_level(logging.WARNING):
        again = build_book(*args, **kwargs)
    assert "recomputing" in caplog.text and str(path) in caplog.text
    np.testing.assert_array_equal(again.upper, first.upper)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        build_book(*args, **kwargs)  # rewritten: read back without a word
    assert "recomputing" not in caplog.text
