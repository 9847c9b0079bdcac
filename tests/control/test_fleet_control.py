"""A controller tick on a user's fleet file: its models, prices and caps, the demand a replay
of its own request log serves, templates vLLM can run, manifests that validate."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import write_fleet
from test_k8s_manifests import k8s_validate

from atoll.control.cli import main
from atoll.control.k8s.apply import render_manifests, validate_object
from atoll.control.k8s.render import k8s_options
from atoll.control.plans import PlanRecord
from atoll.control.replay import ReplayExporter
from atoll.envs.fleet_file import read_fleet
from atoll.solvers.runtime import template_problem

DAY_S = 86400.0


@pytest.fixture()
def fleet_file(tmp_path: Path) -> Iterator[Path]:
    yield write_fleet(tmp_path)


def test_a_tick_on_a_fleet_file(fleet_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = read_fleet(fleet_file)
    with ReplayExporter(fleet.series, fleet.spec.model_names, speedup=60.0, start_s=4 * DAY_S) as replay:
        argv = ["control", "--fleet", str(fleet_file), "--scrape", replay.url, "--policy", "fixed:1",
                "--state", str(tmp_path / "state"), "--sink", f"json:{tmp_path / 'plans'}",
                "--time-scale", "60", "--once", "--json"]
        assert main(argv) == 0  # the first tick reads the counters, a rate needs a second read
        capsys.readouterr()
        time.sleep(1.5)  # 90 trace seconds at 60x
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plan_changed"] and doc["sink_result"]["ok"], json.dumps(doc)[:3000]
    record = PlanRecord.from_dict(json.loads((tmp_path / "plans" / "latest.json").read_text()))
    assert {t["model"] for t in record.templates.values()} == {"Phi-4-14B", "Acme-8B"}
    for key in record.plan:
        t = record.templates[key]
        assert t["region"] == "aws:us-east-2"
    docs = render_manifests(record, k8s_options(fleet.spec.kubernetes, f"{fleet_file}: kubernetes"))
    assert any("acme/acme-8b" in json.dumps(d) for d in docs)
    for d in docs:
        k8s_validate(d)
        validate_object(d)
    assert fleet.scenario.model("Acme-8B").layers == 32 and template_problem is not None


def test_a_fleet_file_with_slices_plans_and_controls_packed_nodes(fleet_file: Path, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    doc = yaml.safe_load(fleet_file.read_text())
    fleet_file.write_text(yaml.safe_dump({**doc, "slices": True}, sort_keys=False))
    assert main(["solve", "--fleet", str(fleet_file), "--json"]) == 0
    solved = json.loads(capsys.readouterr().out)
    assert solved["slices"] is True and solved["packing_violations"] == []
    assert sum(solved["packing"]["nodes_per_pool"].values()) == len(solved["packing"]["nodes"]) > 0
    fleet = read_fleet(fleet_file)
    assert fleet.scenario.slices
    with ReplayExporter(fleet.series, fleet.spec.model_names, speedup=60.0, start_s=4 * DAY_S) as replay:
        argv = ["control", "--fleet", str(fleet_file), "--scrape", replay.url, "--policy", "fixed:1",
                "--state", str(tmp_path / "state"), "--sink", f"json:{tmp_path / 'plans'}",
                "--time-scale", "60", "--once", "--json"]
        assert main(argv) == 0
        capsys.readouterr()
        time.sleep(1.5)
        code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["plan_changed"]
    record = PlanRecord.from_dict(json.loads((tmp_path / "plans" / "latest.json").read_text()))
    # the record holds its nodes: every planned slice on one node, pools as many nodes as listed
    assert record.packing is not None and record.nodes_per_pool
    assert sum(record.nodes_per_pool.values()) == len(record.packing["nodes"])
    assert all(n["used_gpus"] <= n["gpus"] for n in record.packing["nodes"])
    # a fleet whose runtime cannot run slices is refused, naming the field
    fleet_file.write_text(yaml.safe_dump({**doc, "slices": True, "runtime": "any"}, sort_keys=False))
    assert main(["solve", "--fleet", str(fleet_file), "--json"]) != 0
    assert "slices" in capsys.readouterr().err


def test_a_spot_fleet_is_priced_at_spot_by_the_controller() -> None:
    """The bundled fleets buy in the spot market: every template of the live plan is a spot
    tier's, costed at spot prices, unless the user says otherwise."""
    from atoll.control.live_fleet import load_fleet_file

    spot, on_demand = load_fleet_file("core"), load_fleet_file("core", prices="on-demand")
    assert {spot.tier(k) for k in spot.templates} == {"spot"}
    assert {on_demand.tier(k) for k in on_demand.templates} == {"on-demand"}
    assert on_demand.config.prices == "on-demand"
