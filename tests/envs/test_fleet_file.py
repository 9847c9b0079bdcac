"""A fleet file at work: loaded as a value, its demand scaled as stated, solved and simulated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from request_logs import request_log as shared_request_log

from atoll.envs.fleet_env import FleetEnv
from atoll.envs.fleet_file import fleet_config, read_fleet
from atoll.forecast.workloads import load_workload
from atoll.solvers.allocation import solve_allocation
from atoll.solvers.catalog import load_catalog
from atoll.solvers.errors import UnknownNameError
from atoll.solvers.fleet import FleetFileError
from atoll.solvers.models import get_model
from atoll.solvers.runtime import template_problem
from atoll.solvers.scenarios import build_problem


def request_log(path: Path, days: int = 5, seed: int = 0) -> Path:
    """A user's request log: two models, a daily cycle, seeded arrivals and lengths."""
    return shared_request_log(path, days, seed, rates=(0.02, 0.01))


FLEET = {
    "name": "acme-test", "runtime": "vllm",
    "models": ["Phi-4-14B", {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                             "head_dim": 128, "params_b": 8.0, "active_params_b": 8.0,
                             "bytes_per_param": 2, "slo": {"ttft_ms": 800, "tpot_ms": 40}}],
    "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "L40S"]}],
    "availability": {"static": {"aws:us-east-2/1xL4": 40, "aws:us-east-2/4xL4": 10,
                                "aws:us-east-2/1xL40S": 20}},
    "workloads": {"Phi-4-14B": {"source": "csv:requests.csv#phi-4", "mean_rate": 2.0},
                  "Acme-8B": {"source": "csv:requests.csv#acme-8b", "scale": 100}},
}


@pytest.fixture()
def fleet_file(tmp_path: Path) -> Path:
    request_log(tmp_path / "requests.csv")
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(FLEET))
    return path


def test_a_fleet_scales_as_stated_and_solves_with_vllm_templates(fleet_file: Path) -> None:
    fleet = read_fleet(fleet_file)
    spec = fleet.scenario
    assert spec.model("Acme-8B").layers == 32 and fleet.days == 5
    phi, acme = fleet.series
    assert phi.name == "Phi-4-14B" and np.mean(phi.requests_per_s) == pytest.approx(2.0)
    raw = load_workload(f"csv:{fleet_file.parent / 'requests.csv'}#acme-8b", step_s=300)
    assert acme.requests_per_s == pytest.approx(100 * raw.requests_per_s)  # scale: exactly x100
    assert set(spec.catalog.offers_in("aws:us-east-2")) <= {f"{n}x{g}" for g in ("L4", "L40S")
                                                            for n in (1, 2, 4, 8)}
    problem = build_problem(spec, "ample", "even")
    assert problem.availability[("aws:us-east-2", "4xL4")] == 10
    assert problem.availability[("aws:us-east-2", "4xL40S")] == 0  # cells the file leaves out
    result = solve_allocation(problem)
    assert result.status.value == "optimal" and result.goodput_fraction == pytest.approx(1.0)
    for key, _ in result.allocation.counts:
        t = problem.template(key)
        assert template_problem("vllm", spec.model(t.service.model), t) is None


def test_loading_a_fleet_changes_nothing_outside_its_value(fleet_file: Path) -> None:
    """The shipped catalog, models and scenarios are what they were: the fleet is only a value."""
    from atoll.solvers.scenarios import SCENARIOS

    offers, scenarios = load_catalog().offers, dict(SCENARIOS)
    fleet = read_fleet(fleet_file)
    assert fleet.scenario.catalog.offers != offers  # the fleet's catalog is its own
    assert load_catalog().offers == offers and dict(SCENARIOS) == scenarios
    with pytest.raises(UnknownNameError):
        get_model("Acme-8B")
    with pytest.raises(UnknownNameError):
        build_problem("acme-test")  # a fleet is passed, never looked up by name


def test_a_fleet_may_not_take_a_bundled_scenarios_name(fleet_file: Path) -> None:
    for name in ("core", "extended", "fleet20"):
        fleet_file.write_text(yaml.safe_dump({**FLEET, "name": name}))
        with pytest.raises(FleetFileError, match="bundled"):
            read_fleet(fleet_file)


def test_the_bundled_core_fleet_is_the_core_scenario_with_its_request_lengths(fleet_file: Path) -> None:
    from atoll.solvers.scenarios import SCENARIOS, request_shapes

    fleet = read_fleet("core")  # the shipped file may carry the scenario's name; a user's may not
    scenario = SCENARIOS["core"]
    assert fleet.name == fleet.scenario.name == "core" and fleet.scenario.models == scenario.models
    assert request_shapes(fleet.scenario) == request_shapes(scenario)  # the Azure means, not the series'
    assert fleet.scenario.traces == scenario.traces and fleet.scenario.scarce_headroom == 0.25
    assert dict(fleet.scenario.rates) == dict.fromkeys(scenario.models, scenario.req_per_s)
    copy = fleet_file.parent / "core.yaml"
    copy.write_text(fleet.spec.path.read_text())
    with pytest.raises(FleetFileError, match="bundled"):
        read_fleet(copy)


def test_a_fleets_request_shapes_deal_the_azure_means_in_turn(fleet_file: Path) -> None:
    from atoll.solvers.scenarios import trace_shape

    fleet_file.write_text(yaml.safe_dump({**FLEET, "request_shapes": ["conv"], "scarce_headroom": 0.5}))
    fleet = read_fleet(fleet_file)
    assert dict(fleet.scenario.shapes) == dict.fromkeys(("Phi-4-14B", "Acme-8B"), trace_shape("conv"))
    assert fleet.scenario.traces == ("conv",) and fleet.scenario.scarce_headroom == 0.5


def test_the_simulator_runs_on_the_fleets_own_demand(fleet_file: Path) -> None:
    fleet = read_fleet(fleet_file)
    env = FleetEnv(fleet_config(fleet, (4, 5)))
    assert env.models == ("Phi-4-14B", "Acme-8B")
    env.reset(seed=0)
    _, reward, *_ = env.step(np.ones(2, dtype=np.int8))
    assert np.isfinite(reward)
    with pytest.raises(FleetFileError, match="workloads cover days 1-5"):
        fleet_config(fleet, (4, 9))


def test_a_log_beside_a_longer_bundled_trace_simulates_their_common_days(fleet_file: Path) -> None:
    """A 5-day log and a 14-day ServeGen trace: the simulator gets both cut to days 1-5."""
    doc = {**FLEET, "workloads": {**FLEET["workloads"],
                                  "Acme-8B": {"source": "servegen:m-small", "mean_rate": 1.0}}}
    fleet_file.write_text(yaml.safe_dump(doc))
    fleet = read_fleet(fleet_file)
    assert sorted(len(s) for s in fleet.series) == [5 * 288, 14 * 288] and fleet.days == 5
    config = fleet_config(fleet, (4, 5))
    assert [len(s) for s in config.demand] == [5 * 288, 5 * 288]
    long = next(s for s in fleet.series if len(s) > 5 * 288)
    cut = next(s for s in config.demand if s.name == long.name)
    assert np.array_equal(cut.requests_per_s, long.requests_per_s[:5 * 288])
    env = FleetEnv(config)
    env.reset(seed=0)
    assert np.isfinite(env.step(np.ones(2, dtype=np.int8))[1])


def test_a_bad_workload_source_names_the_entry(fleet_file: Path) -> None:
    doc = yaml.safe_load(fleet_file.read_text())
    doc["workloads"]["Acme-8B"] = {"source": "csv:missing.csv#acme"}
    fleet_file.write_text(yaml.safe_dump(doc))
    with pytest.raises(FleetFileError, match=r"workloads\['Acme-8B'\]: field 'source'"):
        read_fleet(fleet_file)


def test_a_pool_trace_moves_the_simulators_spot_tier(fleet_file: Path) -> None:
    (fleet_file.parent / "l40s.csv").write_text("time_s,nodes\n0,20\n345600,3\n")  # 3 nodes from day 5
    doc = yaml.safe_load(fleet_file.read_text())
    del doc["availability"]["static"]["aws:us-east-2/1xL40S"]
    doc["availability"]["traces"] = {"aws:us-east-2/1xL40S": "l40s.csv"}
    doc["availability"]["markets"] = {"aws:us-east-2/1xL40S": "spot"}
    fleet_file.write_text(yaml.safe_dump(doc))
    fleet = read_fleet(fleet_file)
    problem = build_problem(fleet.scenario, "market", "even")
    assert problem.availability[("aws:us-east-2~spot", "1xL40S")] == 20  # the most the pool offers
    assert ("aws:us-east-2", "1xL40S") not in problem.prices  # a spot pool sells no on-demand
    env = FleetEnv(fleet_config(fleet, (4, 5)))
    assert env.config.availability == "market" and env.config.price_kind == "market"
    caps = env._availability  # noqa: SLF001 - the env's own availability process
    assert caps.capacity(4 * 86400 - 300)[("aws:us-east-2~spot", "1xL40S")] == 20
    assert caps.capacity(4 * 86400)[("aws:us-east-2~spot", "1xL40S")] == 3
    assert caps.capacity(4 * 86400)[("aws:us-east-2", "4xL4")] == 10


def test_a_hedged_pool_keeps_its_on_demand_quota_when_its_spot_trace_drops(fleet_file: Path) -> None:
    (fleet_file.parent / "l4.csv").write_text("time_s,event,nodes\n0,capacity,30\n345600,preempt,30\n")
    doc = yaml.safe_load(fleet_file.read_text())
    doc["regions"][0]["market"] = "hedged"
    del doc["availability"]["static"]["aws:us-east-2/1xL4"]
    doc["availability"]["traces"] = {"aws:us-east-2/1xL4": "l4.csv"}
    doc["availability"]["ondemand_quota"] = {"aws:us-east-2/1xL4": 2}
    fleet_file.write_text(yaml.safe_dump(doc))
    env = FleetEnv(fleet_config(read_fleet(fleet_file), (4, 5)))
    env.reset(seed=0)
    caps = env._availability  # noqa: SLF001
    before, after = caps.capacity(4 * 86400 - 300), caps.capacity(4 * 86400)
    assert before[("aws:us-east-2~spot", "1xL4")] == 30 and after[("aws:us-east-2~spot", "1xL4")] == 0
    assert before[("aws:us-east-2", "1xL4")] == after[("aws:us-east-2", "1xL4")] == 2
    # the other pools of the hedged region: a spot tier on the region's bundled trace beside an
    # on-demand quota that defaults to ample
    assert after[("aws:us-east-2", "4xL4")] == 1000 and ("aws:us-east-2~spot", "4xL4") in after


def test_a_user_region_in_a_spot_market_needs_a_trace(fleet_file: Path) -> None:
    doc = yaml.safe_load(fleet_file.read_text())
    doc["regions"].append({"name": "lab:rack-1", "market": "spot",
                           "offers": [{"config": "4xL4", "on_demand": 3.0, "spot": 1.0}]})
    fleet_file.write_text(yaml.safe_dump(doc))
    with pytest.raises(FleetFileError, match=r"spot or hedged pool\(s\) lab:rack-1/4xL4 have no trace"):
        read_fleet(fleet_file)


def test_the_fleets_scaling_is_logged_and_given_once(fleet_file: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    import logging

    with caplog.at_level(logging.INFO, logger="atoll"):
        read_fleet(fleet_file)
    lines = sorted(r.getMessage() for r in caplog.records if "scaled by" in r.getMessage())
    assert len(lines) == 2 and all(r.levelno == logging.INFO for r in caplog.records if "scaled by" in r.msg)
    assert "workloads['Acme-8B']" in lines[0] and "scaled by factor:100: requests/s x100," in lines[0]
    assert "workloads['Phi-4-14B']" in lines[1] and "scaled by mean:2:" in lines[1]
    doc = yaml.safe_load(fleet_file.read_text())
    doc["workloads"]["Acme-8B"]["source"] = "csv:requests.csv#acme-8b@mean:3"
    fleet_file.write_text(yaml.safe_dump(doc))
    with pytest.raises(FleetFileError, match=r"workloads\['Acme-8B'\].*give the scaling once"):
        read_fleet(fleet_file)
    del doc["workloads"]["Acme-8B"]["scale"]
    fleet_file.write_text(yaml.safe_dump(doc))
    active = read_fleet(fleet_file)
    # mean:3 is the mean over the model's span (from its first to its last request; gaps left out)
    assert dict(active.mean_rates)["Acme-8B"] == pytest.approx(3.0)
    mc = dict(active.model_checks)["Acme-8B"]
    span = active.series[1].requests_per_s[mc.first_step: mc.last_step + 1]
    assert np.mean(span) == pytest.approx(3.0)


def test_the_market_availability_belongs_to_fleet_files() -> None:
    from atoll.envs.config import FleetConfig
    from atoll.solvers.errors import InputError

    with pytest.raises(InputError, match="'market' is a fleet file's own market per pool"):
        FleetConfig(scenario="core", availability="market")
