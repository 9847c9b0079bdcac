"""The steady and bursty halves of the ServeGen scenario: which clients, how the groups are cut,
and that the bursty demand is the burstier one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from atoll.envs.demand import workload_series
from atoll.forecast.workloads import (
    LANGUAGE_MODELS,
    WorkloadError,
    client_burstiness,
    n_model_groups,
    split_clients,
)
from atoll.solvers.scenarios import SCENARIOS


@pytest.mark.parametrize("source", LANGUAGE_MODELS)
def test_the_halves_part_the_active_clients_by_their_burstiness(shared_data: Path, source: str) -> None:
    volume, cv = client_burstiness(source, shared_data)
    steady = split_clients(source, "steady", shared_data)
    bursty = split_clients(source, "bursty", shared_data)
    active = {i for i in range(len(volume)) if volume[i] > 0}
    assert set(steady) | set(bursty) == active and not set(steady) & set(bursty)
    assert max(cv[steady]) <= min(cv[bursty])  # ordered by CV: no steady client is burstier
    share = volume[steady].sum() / volume.sum()
    assert 0.3 < share < 0.5  # the steady side stops below half the volume
    assert split_clients(source, "all", shared_data) == list(range(len(volume)))


def test_the_groups_of_a_half_cut_its_clients(shared_data: Path) -> None:
    for split in ("steady", "bursty"):
        groups = n_model_groups(6, shared_data, split)
        assert [name for _, _, name in groups][:2] == [f"m-large/{split}/g0", f"m-large/{split}/g1"]
        for source in LANGUAGE_MODELS:
            members = [c for s, clients, _ in groups if s == source for c in clients]
            assert sorted(members) == split_clients(source, split, shared_data)
    with pytest.raises(WorkloadError, match="unknown demand split 'spiky'; valid: all, steady, bursty"):
        split_clients("m-large", "spiky", shared_data)
    with pytest.raises(WorkloadError, match="m-mid has 13 clients bursty; it cannot make 14 groups"):
        n_model_groups(42, shared_data, "bursty")


def test_the_bursty_demand_moves_more_from_step_to_step() -> None:
    spec = SCENARIOS["core"]

    def variability(workload: str) -> np.ndarray:
        series = workload_series(workload, spec.models, spec.req_per_s, 300.0, resample="sampled", seed=0)
        rates = np.stack([s.requests_per_s for s in series])
        assert np.allclose(rates.mean(axis=1), spec.req_per_s, rtol=1e-3)  # sampled at the scenario's rate
        return np.std(np.diff(rates, axis=1), axis=1) / rates.mean(axis=1)

    steady, whole, bursty = (variability(w) for w in ("servegen-steady", "servegen", "servegen-bursty"))
    assert np.all(steady < whole) and np.all(whole < bursty) and np.all(bursty > 2 * steady)
