"""Loaders against the source files; scaling; N-model scenarios; the user CSV log."""

from __future__ import annotations

import csv
import gzip
from pathlib import Path

import numpy as np
import pytest

from atoll.forecast.workloads import (
    WorkloadError,
    load_azure,
    load_request_log,
    load_servegen,
    load_workload,
    n_model_scenario,
    scale_to_mean_rate,
)


def test_servegen_rates_sum_the_client_files(shared_data: Path) -> None:
    folder = shared_data / "servegen" / "data" / "language" / "m-small"
    total = 0.0
    rows = 0
    for f in folder.glob("chunk-*-trace.csv.gz"):
        with gzip.open(f, "rt") as fh:
            for row in csv.reader(fh):
                total += float(row[1])
                rows += 1
    s = load_servegen("m-small", step_s=600, data=shared_data)
    assert len(s) == 2016 and rows == 2016 * 43
    assert s.requests_per_s.sum() == pytest.approx(total)
    assert np.all(s.input_tokens > 0) and np.all(s.output_tokens > 0)
    # 5-min steps keep the same request volume
    fine = load_servegen("m-small", step_s=300, data=shared_data)
    assert fine.requests_per_s.sum() == pytest.approx(2 * total)


def test_azure_counts_every_request(shared_data: Path) -> None:
    with (shared_data / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    s = load_azure("conv", step_s=60, data=shared_data)
    assert (s.requests_per_s * 60).sum() == pytest.approx(len(rows))
    assert (s.prefill_tokens_per_s * 60).sum() == pytest.approx(sum(float(r["ContextTokens"]) for r in rows))


def test_scale_and_days(shared_data: Path) -> None:
    s = load_workload("servegen:m-large", data=shared_data)
    scaled = scale_to_mean_rate(s, 10.0)
    assert scaled.requests_per_s.mean() == pytest.approx(10.0)
    week2 = scaled.days(8, 14)
    assert len(week2) == 7 * 288 and week2.start_s == 7 * 86400
    with pytest.raises(WorkloadError, match="days 1-14"):
        s.days(10, 15)


def test_n_model_scenario_is_deterministic(shared_data: Path) -> None:
    a = n_model_scenario(6, data=shared_data)
    b = n_model_scenario(6, data=shared_data)
    assert [s.name for s in a] == ["m-large/g0", "m-large/g1", "m-mid/g0", "m-mid/g1", "m-small/g0",
                                   "m-small/g1"]
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x.requests_per_s, y.requests_per_s)
    # groups partition the clients: their volumes add up to the source model's
    total = load_servegen("m-large", data=shared_data).requests_per_s
    np.testing.assert_allclose(a[0].requests_per_s + a[1].requests_per_s, total)
    assert len(n_model_scenario(20, data=shared_data)) == 20


def test_request_log(tmp_path: Path) -> None:
    p = tmp_path / "log.csv"
    p.write_text("timestamp,model,input_tokens,output_tokens\n0,a,100,10\n30,a,300,30\n"
                 "400,b,50,5\n2024-01-01T00:00:00,a,1,1\n")
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workload("kaggle:x")
    p.write_text("timestamp,model,input_tokens,output_tokens\n0,a,100,10\n30,a,300,30\n400,b,50,5\n")
    logs = load_request_log(p, step_s=300)
    assert set(logs) == {"a", "b"}
    assert logs["a"].requests_per_s[0] == pytest.approx(2 / 300)
    assert logs["a"].input_tokens[0] == pytest.approx(200)
    assert logs["b"].requests_per_s[1] == pytest.approx(1 / 300)
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,model,input_tokens,output_tokens\n0,a,100,10\n1,a,-5,3\n")
    with pytest.raises(WorkloadError, match=r"bad.csv:3: token counts must be >= 0"):
        load_request_log(bad)
    bad.write_text("timestamp,model,input_tokens,output_tokens\nnoon,a,100,10\n")
    with pytest.raises(WorkloadError, match=r"bad.csv:2: malformed row"):
        load_request_log(bad)
    with pytest.raises(FileNotFoundError, match="request log not found"):
        load_request_log(tmp_path / "nope.csv")
