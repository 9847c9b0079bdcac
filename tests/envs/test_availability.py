"""Availability processes: static caps, spot caps from the real traces, determinism."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atoll.envs.availability import (
    SPOT_TRACES,
    SpotAvailability,
    SpotTrace,
    StaticAvailability,
    load_spot_trace,
)


def test_trace_loads_and_matches_source(shared_data: Path) -> None:
    import json

    trace = load_spot_trace(shared_data, "aws:us-east-2")
    raw = json.loads(Path(trace.source).read_text())
    assert len(trace.values) == len(raw["data"]) and sum(trace.values) == sum(raw["data"])
    assert trace.gap_seconds == 300 and max(trace.values) <= 16


def test_spot_caps_follow_trace_and_are_seeded(shared_data: Path) -> None:
    traces = {r: load_spot_trace(shared_data, r) for r in SPOT_TRACES}
    base = {("aws:us-east-2", "4xL4"): 8, ("aws:us-east-2", "1xL40S"): 16,
            ("gcp:us-central1", "8xH100"): 4}
    a, b = SpotAvailability(base, traces), SpotAvailability(base, traces)
    a.reset(np.random.default_rng(7))
    b.reset(np.random.default_rng(7))
    series_a = [a.capacity(t * 300.0) for t in range(288)]
    assert series_a == [b.capacity(t * 300.0) for t in range(288)]
    for caps in series_a:
        for cell, cap in caps.items():
            assert 0 <= cap <= base[cell]
    # the trace has outages and recoveries, so the cap must move within a day somewhere
    assert len({caps[("aws:us-east-2", "1xL40S")] for caps in series_a}) > 1
    # cap = floor(base x trace(t + offset) / 16), by hand for one step
    cell = ("aws:us-east-2", "4xL4")
    tr = traces["aws:us-east-2"]
    i = int((1500.0 + a.offsets[cell]) // 300) % len(tr.values)
    assert a.capacity(1500.0)[cell] == (8 * tr.values[i]) // 16


def test_static_is_constant() -> None:
    s = StaticAvailability({("r", "1xL4"): 3})
    s.reset(np.random.default_rng(0))
    assert s.capacity(0.0) == s.capacity(1e6) == {("r", "1xL4"): 3}


def test_bad_input() -> None:
    with pytest.raises(KeyError, match="regions with one: aws:ap-northeast-2"):
        load_spot_trace(Path("/nonexistent"), "mars-1")
    with pytest.raises(FileNotFoundError, match="spot trace missing: /nonexistent"):
        load_spot_trace(Path("/nonexistent"), "aws:us-east-2")
    with pytest.raises(ValueError, match="values must lie in 0..16"):
        SpotTrace((0, 17), 300.0, 16, "x")
    with pytest.raises(ValueError, match="no trace for regions \\['mars'\\]"):
        SpotAvailability({("mars", "1xL4"): 1}, {})
    with pytest.raises(RuntimeError, match="before reset"):
        SpotAvailability({}, {}).capacity(0.0)
