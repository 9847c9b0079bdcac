"""Calibration: the vectorized fit predicts what the performance model computes, and the fit
reaches its held-out error target on the public profiles."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atoll.solvers.calibrate import _design, calibrate, predict_seconds, split
from atoll.solvers.catalog import load_catalog
from atoll.solvers.perf import SIBLING, load_factors, step_seconds
from atoll.solvers.profiles import DATASETS, load_observations


@pytest.fixture(scope="module")
def rows(shared_data: Path):  # type: ignore[no-untyped-def]
    return load_observations(shared_data, load_catalog())


def test_vectorized_prediction_equals_step_seconds(rows) -> None:  # type: ignore[no-untyped-def]
    f = load_factors()
    sample = rows[::37]
    keys = sorted({SIBLING[o.gpu] for o in sample})
    vec = predict_seconds(_design(sample, keys), f, keys)
    ref = [sum(p.weight * step_seconds(o.model, o.config, p.layers, p.phase, tokens=p.tokens,
                                       context=p.context, factors=f) for p in o.parts)
           for o in sample]
    np.testing.assert_allclose(vec, ref, rtol=1e-10)


def test_rows_cover_every_dataset_and_gpu(rows) -> None:  # type: ignore[no-untyped-def]
    assert {o.dataset for o in rows} == set(DATASETS)
    assert {o.gpu for o in rows} == {"T4", "L4", "V100", "A100-40GB", "A100-80GB", "H100"}
    assert all(o.measured_s > 0 for o in rows)


def test_split_never_cuts_a_group(rows) -> None:  # type: ignore[no-untyped-def]
    train, test = split(rows, seed=3)
    groups = lambda rs: {o.group.rsplit("/", 1)[0] for o in rs}  # noqa: E731
    assert not groups(train) & groups(test)
    assert len(train) + len(test) == len(rows)


def test_heldout_error_target(shared_data: Path) -> None:
    report = calibrate(shared_data)
    for ds in DATASETS:
        assert report["heldout_mape"][ds] <= 0.15, (ds, report["heldout_mape"])
    assert set(report["leave_one_gpu_out_mape"]) == {"T4", "L4", "V100", "A100", "H100"}


def test_report_gives_error_per_phase_and_tp(shared_data: Path) -> None:
    report = calibrate(shared_data)
    sw = report["heldout_mape_by_phase_tp"]["splitwise"]
    assert set(sw) == {"prefill", "decode"} and set(sw["decode"]) == {"2", "4", "8"}
    assert all(0 <= v < 1 for v in sw["decode"].values())
    f = report["factors"]
    assert f["decode_hop_us"] > 0 and f["decode_skew"] > 0
