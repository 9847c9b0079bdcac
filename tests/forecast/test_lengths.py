"""Azure length statistics against the source files, the alternating assignment, and the
day-range and frame helpers the fleet env uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from atoll.forecast.lengths import LengthStats, assign_azure_lengths, azure_length_stats
from atoll.forecast.workloads import WorkloadError


def test_stats_match_the_source_files(shared_data: Path) -> None:
    stats = azure_length_stats(shared_data)
    assert sorted(stats) == ["code", "conv"]
    folder = shared_data / "azure-llm-inference-2023"
    for trace, rows in (("code", 8819), ("conv", 19366)):
        df = pd.read_csv(folder / f"AzureLLMInferenceTrace_{trace}.csv")
        s = stats[trace]
        assert s.requests == len(df) == rows
        assert s.mean_input_tokens == pytest.approx(df["ContextTokens"].mean())
        assert s.mean_output_tokens == pytest.approx(df["GeneratedTokens"].mean())
    # code completion is prefill-heavy, conversation decode-heavy (SOURCE.md: 2048/28, 1155/211)
    assert stats["code"].mean_input_tokens == pytest.approx(2048, abs=1)
    assert stats["conv"].mean_output_tokens == pytest.approx(211, abs=1)


def test_assignment_alternates(shared_data: Path) -> None:
    got = assign_azure_lengths(5, shared_data)
    assert [s.trace for s in got] == ["code", "conv", "code", "conv", "code"]


def test_bad_input_is_named(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="n_models"):
        assign_azure_lengths(0)
    with pytest.raises(WorkloadError, match="requests"):
        LengthStats("code", 0, 1.0, 1.0)
    with pytest.raises(WorkloadError, match="mean_output_tokens"):
        LengthStats("code", 3, 1.0, float("nan"))
    folder = tmp_path / "azure-llm-inference-2023"
    folder.mkdir()
    with pytest.raises(FileNotFoundError, match="AzureLLMInferenceTrace_code.csv"):
        azure_length_stats(tmp_path)
    (folder / "AzureLLMInferenceTrace_code.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,12,x\n")
    (folder / "AzureLLMInferenceTrace_conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    with pytest.raises(WorkloadError, match=r"code.csv:2"):
        azure_length_stats(tmp_path)


def test_load_workload_days_and_frame(shared_data: Path) -> None:
    from atoll.forecast.workloads import load_workload

    full = load_workload("servegen:m-large", data=shared_data)
    week2 = load_workload("servegen:m-large", data=shared_data, days=range(8, 15))
    assert len(week2) == 7 * 288
    np.testing.assert_array_equal(week2.requests_per_s, full.requests_per_s[7 * 288:])
    frame = week2.to_frame()
    assert frame.index[0] == pd.Timedelta(days=7)
    assert frame.index[1] - frame.index[0] == pd.Timedelta(minutes=5)
    np.testing.assert_allclose(frame["prefill_tokens_per_s"],
                               week2.requests_per_s * week2.input_tokens)
    with pytest.raises(WorkloadError, match="consecutive"):
        load_workload("servegen:m-large", data=shared_data, days=range(8, 15, 2))
    with pytest.raises(WorkloadError, match="out of range"):
        load_workload("servegen:m-large", data=shared_data, days=range(10, 16))
