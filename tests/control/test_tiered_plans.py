"""The live controller plans in the fleet file's own market: a hedged pool's instances are bought
at spot or on-demand as the ILP picks, every plan line names its tier, the plan's $/h is its
lines billed at their tiers, and a spot line's pods select spot capacity."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from control_helpers import tiny_series
from fleet_helpers import fleet_doc, request_log
from prometheus_client.parser import text_string_to_metric_families

from atoll.control.cli import main
from atoll.control.live_fleet import load_fleet_file
from atoll.control.plans import PlanRecord
from atoll.control.replay import ReplayExporter
from atoll.control.sinks import MetricsSink
from atoll.envs.fleet_file import fleet_config, read_fleet
from atoll.solvers.catalog import load_catalog
from atoll.solvers.types import node_config_of, parse_config_name

CELL = "aws:us-east-2/1xL40S"
MODELS = ["Phi-4-14B", "Acme-8B"]


def _fleet(folder: Path, market: str, **availability: Any) -> Path:
    """The test fleet (Phi-4-14B and Acme-8B on the seeded request log) on 1xL40S nodes only, in
    ``market``: one spot node at most, the rest (a hedged pool's) on-demand quota."""
    request_log(folder / "requests.csv")
    doc = fleet_doc()
    doc["regions"] = [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L40S"], "market": market}]
    doc["availability"] = {"static": {CELL: 1 if market != "on-demand" else 12}, **availability}
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture()
def hedged(tmp_path: Path) -> Iterator[Path]:
    # a hedged pool's quota is ample unless given: the larger L40S nodes get none
    yield _fleet(tmp_path, "hedged", ondemand_quota={CELL: 12, "aws:us-east-2/4xL40S": 0,
                                                     "aws:us-east-2/8xL40S": 0})


def _once(fleet_file: Path, tmp_path: Path, sink: str, capsys: pytest.CaptureFixture[str],
          *extra: str) -> dict[str, Any]:
    series = [tiny_series(m, [3.0] * 600, input_tokens=900, output_tokens=180) for m in MODELS]
    with ReplayExporter(series, MODELS, speedup=60.0) as replay:
        code = main(["control", "--fleet", str(fleet_file), "--scrape", replay.url, "--policy", "fixed:1",
                     "--state", str(tmp_path / "state"), "--sink", sink, "--time-scale", "60",
                     "--first-gap", "1s", "--once", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    assert doc["plan_changed"], json.dumps(doc)[:2000]
    return doc


def _priced_by_hand(record: PlanRecord) -> tuple[float, dict[str, float]]:
    """The plan's $/h from the catalog's own prices at each line's tier: per pool and tier the
    whole nodes its instances use (a slice g/G: its share, the pool the ceil of its shares) x the
    node's price at that tier, and its split by tier."""
    catalog = load_catalog()
    use: dict[tuple[str, str, str], float] = {}
    for key, n in record.plan.items():
        d = record.templates[key]
        for config, k in d["nodes"]:
            g, node_gpus, _ = parse_config_name(config)
            cell = (d["region"], node_config_of(config), d["tier"])
            use[cell] = use.get(cell, 0.0) + n * k * g / node_gpus
    total, by_tier = 0.0, {"on-demand": 0.0, "spot": 0.0}
    for (region, config, tier), used in use.items():
        offer = catalog.offer(region, config)
        assert offer is not None and offer.spot_per_hour is not None
        cost = math.ceil(used - 1e-9) * (offer.spot_per_hour if tier == "spot" else offer.on_demand_per_hour)
        total += cost
        by_tier[tier] += cost
    return total, {t: v for t, v in by_tier.items() if v}


def test_a_hedged_fleet_plans_both_tiers_and_bills_each_line_at_its_own(
        hedged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _once(hedged, tmp_path, f"json:{tmp_path / 'plans'}", capsys)
    record = PlanRecord.from_dict(json.loads((tmp_path / "plans" / "latest.json").read_text()))
    tiers = {record.templates[k]["tier"] for k in record.plan}
    # at least 4 instances (a floor of one per model and phase) and one spot node: both tiers
    assert tiers == {"spot", "on-demand"}, record.templates
    spot = sum(n for k, n in record.plan.items() if record.templates[k]["tier"] == "spot")
    assert spot == 1  # the cheap tier first, up to its one node
    total, by_tier = _priced_by_hand(record)
    assert record.bill is not None
    assert math.isclose(record.bill["usd_per_h"], total, rel_tol=1e-9)
    assert record.bill["usd_per_h_by_tier"] == pytest.approx(by_tier, rel=1e-9)
    assert {line["tier"] for line in record.bill["lines"]} == {"spot", "on-demand"}
    assert all(line["instance"] == "g6e.xlarge" for line in record.bill["lines"])
    # the tick's view (the metrics sink's $/h) is the same bill
    assert doc["plan"]["usd_per_h"] == pytest.approx(total, rel=1e-9)
    assert doc["plan"]["usd_per_h_by_tier"] == pytest.approx(by_tier, rel=1e-9)
    assert {row["tier"] for row in doc["diff"]} == {"spot", "on-demand"}
    sink = MetricsSink(0)  # the metrics sink exports the view's $/h per tier
    try:
        sink.observe_tick(doc["plan"])
        samples = {(x.name, tuple(x.labels.items())): x.value
                   for f in text_string_to_metric_families(sink.exposition().decode()) for x in f.samples}
    finally:
        sink.close()
    for tier, usd in by_tier.items():
        assert samples[("atoll_plan_tier_cost_usd_per_hour", (("tier", tier),))] == pytest.approx(usd)


def test_a_hedged_dry_run_renders_spot_lines_on_spot_capacity(
        hedged: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _once(hedged, tmp_path, f"k8s:{tmp_path / 'manifests'}", capsys, "--dry-run")
    assert not (tmp_path / "manifests").exists()
    (rendered,) = doc["dry_run"]
    record = PlanRecord.from_dict(rendered["plan"])
    seen = set()
    for m in rendered["manifests"]:
        if m["kind"] != "Deployment" or "atoll.io/template-key" not in m["metadata"]["annotations"]:
            continue
        key = m["metadata"]["annotations"]["atoll.io/template-key"]
        if key not in record.plan:
            continue
        selector = m["spec"]["template"]["spec"]["nodeSelector"]
        assert selector["karpenter.sh/capacity-type"] == record.templates[key]["tier"]
        seen.add(record.templates[key]["tier"])
    assert seen == {"spot", "on-demand"}
    assert record.bill is not None and record.bill["usd_per_h"] == pytest.approx(_priced_by_hand(record)[0])


@pytest.mark.parametrize("market", ["spot", "on-demand"])
def test_a_one_market_fleet_bills_that_tier(market: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = _fleet(tmp_path, market)
    if market == "spot":  # a spot pool with room for the plan (its one node caps a hedged pool only)
        doc = yaml.safe_load(path.read_text())
        doc["availability"]["static"][CELL] = 12
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    _once(path, tmp_path, f"json:{tmp_path / 'plans'}", capsys)
    record = PlanRecord.from_dict(json.loads((tmp_path / "plans" / "latest.json").read_text()))
    assert {record.templates[k]["tier"] for k in record.plan} == {market}
    total, by_tier = _priced_by_hand(record)
    assert record.bill is not None and record.bill["usd_per_h"] == pytest.approx(total, rel=1e-9)
    assert set(by_tier) == {market}


def test_the_tier_follows_the_market_and_prices_override_it() -> None:
    core = load_fleet_file("core")  # every pool spot
    assert {core.tier(k) for k in core.templates} == {"spot"}
    key = next(iter(core.templates))
    assert core.model.info(key)[3] < load_fleet_file("core", prices="on-demand").model.info(
        key.replace("~spot", ""))[3]
    assert {load_fleet_file("core", prices="on-demand").tier(k) for k in core.templates
            if "~" not in k} <= {"on-demand"}
    assert load_fleet_file("core", removal_weight=0.5).config.removal_weight == 0.5


def test_a_fleet_files_removal_weight_reaches_the_planner(tmp_path: Path) -> None:
    path = _fleet(tmp_path, "on-demand")
    doc = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**doc, "removal_weight": 0.25}, sort_keys=False))
    fleet = load_fleet_file(path)
    assert fleet.config.removal_weight == 0.25 and fleet.model.base.removal_weight == 0.25
    assert load_fleet_file(path, removal_weight=1.0).model.base.removal_weight == 1.0
    loaded = read_fleet(path)  # the simulator's configuration takes it too; a flag overrides it
    assert fleet_config(loaded, (4, 5)).removal_weight == 0.25
    assert fleet_config(loaded, (4, 5), removal_weight=0.0).removal_weight == 0.0
    path.write_text(yaml.safe_dump({**doc, "removal_weight": -1}, sort_keys=False))
    with pytest.raises(Exception, match="removal_weight"):
        load_fleet_file(path)
