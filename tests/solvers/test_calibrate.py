"""Calibration: the vectorized fit predicts what the performance model computes, the fit
reaches its held-out error target on the public profiles, and a user's calibration is written
to the cache folder, the same bytes every time, never into the package."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from atoll.solvers import paths
from atoll.solvers.calibrate import _design, calibrate, predict_seconds, rounded, split, write_factors
from atoll.solvers.catalog import load_catalog
from atoll.solvers.errors import InputError
from atoll.solvers.perf import SIBLING, PerfFactors, load_factors, step_seconds
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


@pytest.fixture(scope="module")
def report(shared_data: Path) -> dict[str, Any]:
    return calibrate(shared_data)


def test_heldout_error_target(report: dict[str, Any]) -> None:
    for ds in DATASETS:
        assert report["heldout_mape"][ds] <= 0.15, (ds, report["heldout_mape"])
    assert set(report["leave_one_gpu_out_mape"]) == {"T4", "L4", "V100", "A100", "H100"}


def test_report_gives_error_per_phase_and_tp(report: dict[str, Any]) -> None:
    sw = report["heldout_mape_by_phase_tp"]["splitwise"]
    assert set(sw) == {"prefill", "decode"} and set(sw["decode"]) == {"2", "4", "8"}
    assert all(0 <= v < 1 for v in sw["decode"].values())
    f = report["factors"]
    assert f["decode_hop_us"] > 0 and f["decode_skew"] > 0


def _package_state() -> dict[str, str]:
    """Every file under the package's data folder with the SHA-256 of its bytes."""
    return {str(p.relative_to(paths.PACKAGE_DATA)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(paths.PACKAGE_DATA.rglob("*")) if p.is_file()}


def test_a_calibration_is_the_users_the_same_bytes_twice_and_leaves_the_package_alone(
        shared_data: Path, report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "cache"))
    before = _package_state()
    assert paths.perf_factors_path() == paths.PERF_FACTORS_PATH  # no calibration yet: the package's
    first = write_factors(report)
    assert first == tmp_path / "cache" / "perf_factors.json"
    again = write_factors(calibrate(shared_data), tmp_path / "again.json")  # a second, independent run
    assert first.read_bytes() == again.read_bytes()
    assert _package_state() == before
    # the performance model now reads the user's factors
    assert paths.perf_factors_path() == first
    assert load_factors() == PerfFactors.from_json(json.loads(first.read_text())["factors"])
    doc = json.loads(first.read_text())
    assert list(doc) == sorted(doc) and list(doc["factors"]["eta_c"]) == sorted(doc["factors"]["eta_c"])


def test_rounding_keeps_six_significant_digits_and_sorts_keys() -> None:
    assert rounded({"b": 0.12345678901, "a": [1234567.89, float("nan"), 3]}) == {
        "a": [1234570.0, pytest.approx(float("nan"), nan_ok=True), 3], "b": 0.123457}
    assert list(rounded({"b": 1.0, "a": 2.0})) == ["a", "b"]


def test_the_package_table_is_written_only_on_purpose(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path))
    before = _package_state()
    with pytest.raises(InputError, match="--write-package-table"):
        write_factors({"factors": PerfFactors().to_json()}, paths.PERF_FACTORS_PATH)
    assert _package_state() == before


def test_the_maintainer_command_writes_the_package_table_only_when_asked(
        shared_data: Path, report: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from atoll.solvers import calibrate as cal

    table = tmp_path / "package" / "perf_factors.json"  # stands in for the installed package's file
    monkeypatch.setattr(cal, "PERF_FACTORS_PATH", table)
    monkeypatch.setenv("ATOLL_CACHE_DIR", str(tmp_path / "cache"))
    assert cal.main(["--data", str(shared_data), "--write-package-table"]) == 0
    assert json.loads(capsys.readouterr().out)["factors"] == json.loads(table.read_text())["factors"]
    # the same bytes a user's calibration of the same data gets
    assert table.read_bytes() == write_factors(report, tmp_path / "user.json").read_bytes()
    assert not (tmp_path / "cache").exists()  # the maintainer command writes no user calibration
