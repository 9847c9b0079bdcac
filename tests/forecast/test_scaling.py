"""Scaling only when asked: a user's csv: workload is served as recorded, a
scale spec (workload suffix, ``scale=`` / ``--scale``) scales it and says so in one line; the
bundled traces keep the scenario's rate (its definition)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from atoll.envs.demand import workload_series
from atoll.forecast.scaling import Scale, apply_scale, parse_scale, split_scale, with_scale
from atoll.forecast.workloads import WorkloadError, load_workload, scale_to_mean_rate

T0 = 1714521600


def _counts(tmp_path: Path, name: str = "counts.csv") -> Path:
    """Two models, a at 2 requests per minute, b at 1 (0.4 and 0.2 req/s per 300 s step...)."""
    p = tmp_path / name
    rows = "".join(f"{T0 + 60 * k},a,2,100,10\n{T0 + 60 * k},b,1,50,5\n" for k in range(30))
    p.write_text("timestamp,model,requests,mean_input_tokens,mean_output_tokens\n" + rows)
    return p


def _scaling_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "scaled" in r.getMessage()]


def test_csv_workloads_are_served_as_recorded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = _counts(tmp_path)
    with caplog.at_level(logging.DEBUG, logger="atoll"):
        a, b = workload_series(f"csv:{p}#a,csv:{p}#b", ("x", "y"), 10.0, 300.0)
        raw = load_workload(f"csv:{p}#a")
    assert a.requests_per_s.mean() == pytest.approx(2 / 60)
    assert b.requests_per_s.mean() == pytest.approx(1 / 60)
    np.testing.assert_array_equal(a.requests_per_s, raw.requests_per_s)
    assert _scaling_lines(caplog) == []


def test_scaling_applies_only_when_asked_and_says_so(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    p = _counts(tmp_path)
    with caplog.at_level(logging.INFO, logger="atoll"):
        a, b = workload_series(f"csv:{p}#a@mean:10,csv:{p}#b@factor:3", ("x", "y"), 25.0, 300.0)
    assert a.requests_per_s.mean() == pytest.approx(10.0)
    assert b.requests_per_s.mean() == pytest.approx(3 / 60)
    np.testing.assert_allclose(a.input_tokens, 100)  # lengths are kept
    lines = _scaling_lines(caplog)
    assert len(lines) == 2
    assert all(r.levelno == logging.WARNING and r.name.startswith("atoll.") for r in lines)
    assert lines[0].getMessage() == (f"csv:{p}#a@mean:10: scaled by mean:10: requests/s x300, "
                                     f"mean 0.03333 -> 10 req/s")
    assert "factor:3" in lines[1].getMessage()


def test_a_scale_option_reaches_every_name_without_its_own(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    p = _counts(tmp_path, "option.csv")
    assert with_scale("csv:x.csv#a, csv:x.csv#b@none", "mean:10") == "csv:x.csv#a@mean:10,csv:x.csv#b@none"
    assert with_scale("servegen", None) == "servegen"
    with caplog.at_level(logging.INFO, logger="atoll"):
        a, b = workload_series(f"csv:{p}#a,csv:{p}#b@none", ("x", "y"), 25.0, 300.0, scale="mean:10")
    assert a.requests_per_s.mean() == pytest.approx(10.0)  # what --scale mean:10 would pass on
    assert b.requests_per_s.mean() == pytest.approx(1 / 60)  # its own @none wins
    assert len(_scaling_lines(caplog)) == 1
    scaled = load_workload(f"csv:{p}#b", scale="factor:2", days=None)
    assert scaled.requests_per_s.mean() == pytest.approx(2 / 60)


def test_scale_specs(tmp_path: Path) -> None:
    assert parse_scale("mean:10") == Scale("mean", 10.0) and str(parse_scale(" factor:2.5 ")) == "factor:2.5"
    assert parse_scale("none") == Scale("none")
    for bad, match in [("mean:ten", r"'ten' is not a number; use mean:R"), ("mean:-1", "finite number > 0"),
                       ("factor:0", "finite number > 0"), ("double", "not a scale spec"),
                       ("mean:nan", "finite number > 0")]:
        with pytest.raises(WorkloadError, match=match):
            parse_scale(bad, where="--scale")
    assert split_scale("csv:/data/me@corp/log.csv#a") == ("csv:/data/me@corp/log.csv#a", None)
    assert split_scale("servegen:m-large@none") == ("servegen:m-large", Scale("none"))
    with pytest.raises(WorkloadError, match=r"workload 'csv:log.csv#a@mean:x'"):
        split_scale("csv:log.csv#a@mean:x")
    p = tmp_path / "empty.csv"
    p.write_text("timestamp,model,requests,input_tokens,output_tokens\n0,a,0,0,0\n")
    with pytest.raises(WorkloadError, match="no requests cannot be scaled"):
        load_workload(f"csv:{p}@mean:10")


def test_apply_scale_matches_scale_to_mean_rate(tmp_path: Path) -> None:
    s = load_workload(f"csv:{_counts(tmp_path, 'same.csv')}#a")
    np.testing.assert_array_equal(apply_scale(s, "mean:7").requests_per_s,
                                  scale_to_mean_rate(s, 7.0).requests_per_s)  # bit for bit
    assert apply_scale(s, None) is s and apply_scale(s, "none") is s


def test_bundled_traces_keep_the_scenarios_rate(shared_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The scenario's definition: a bundled trace named in a list is scaled to the scenario's
    # rate (logged at INFO, not printed); @none serves it as recorded.
    with caplog.at_level(logging.INFO, logger="atoll"):
        (conv,) = workload_series("azure:conv", ("x",), 10.0, 300.0)
    assert conv.requests_per_s.mean() == pytest.approx(10.0)
    (line,) = _scaling_lines(caplog)
    assert line.levelno == logging.INFO and "the scenario's rate" in line.getMessage()
    (raw,) = workload_series("azure:conv@none", ("x",), 10.0, 300.0)
    np.testing.assert_array_equal(raw.requests_per_s, load_workload("azure:conv").requests_per_s)


def test_the_servegen_scenario_is_unchanged(shared_data: Path, caplog: pytest.LogCaptureFixture) -> None:
    from atoll.forecast.workloads import n_model_scenario

    with caplog.at_level(logging.INFO, logger="atoll"):
        (held,) = workload_series("servegen", ("x",), 10.0, 300.0, resample="hold")
    (group,) = n_model_scenario(1, step_s=300.0)
    np.testing.assert_array_equal(held.requests_per_s, scale_to_mean_rate(group, 10.0).requests_per_s)
    assert any(r.levelno == logging.INFO and "scenario's rate" in r.getMessage() for r in caplog.records)
    (mean25,) = workload_series("servegen@mean:25", ("x",), 10.0, 300.0, resample="hold")
    assert mean25.requests_per_s.mean() == pytest.approx(25.0)
