"""A fleet file's market through the commands: each pool billed at its market's tier, the
flags that override the market said and honoured, ``solve``'s bill of materials."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from atoll.control.cli import build_parser, main
from atoll.solvers.errors import AtollError

T0 = 1714521600
ACME = {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2,
        "slo": {"ttft_ms": 2000, "tpot_ms": 150}}
SPOT, ON_DEMAND = 0.4, 1.0  # $/node-hour of the fleet's one pool


def spot_fleet(tmp_path: Path, market: str = "spot", **availability: Any) -> Path:
    """One model on a region of the user's own: one 1xL4 pool in ``market`` on its own trace (a
    preemption log: 6 nodes, 4 preempted on day 5)."""
    rng = np.random.default_rng(1)
    times = np.sort(rng.uniform(0, 5 * 86400, 4000))
    (tmp_path / "log.csv").write_text("timestamp,model,input_tokens,output_tokens\n" + "".join(
        f"{T0 + t:.3f},acme,{int(rng.integers(50, 900))},{int(rng.integers(5, 300))}\n" for t in times))
    (tmp_path / "pool.csv").write_text("time_s,event,nodes\n0,capacity,6\n360000,preempt,4\n")
    doc = {"name": "acme", "models": [ACME],
           "regions": [{"name": "lab:rack-1", "market": market,
                        "offers": [{"config": "1xL4", "on_demand": ON_DEMAND, "spot": SPOT}]}],
           "availability": {"traces": {"lab:rack-1/1xL4": "pool.csv"}, **availability},
           "workloads": {"Acme-8B": {"source": "csv:log.csv#acme", "mean_rate": 1.0}}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any], str]:
    code = main([*argv, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def test_simulate_bills_a_spot_fleet_at_spot_prices(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fleet = str(spot_fleet(tmp_path))
    code, doc, _ = _run(capsys, "simulate", "--fleet", fleet, "--days", "4")
    extra = doc["policies"]["fixed:1"]["extra"]
    assert code == 0 and doc["availability"] == "market" and doc["market"] == "spot"
    assert extra["ondemand_node_hour_share"] == 0.0 and extra["node_hours"] > 0
    assert doc["totals"]["cost_usd"] / extra["node_hours"] == pytest.approx(SPOT)
    # the flag that overrides the file's market is said, and its bill follows it
    code, doc, err = _run(capsys, "simulate", "--fleet", fleet, "--days", "4", "--availability", "ample")
    extra = doc["policies"]["fixed:1"]["extra"]
    assert code == 0 and "--availability ample overrides the fleet file's market (spot)" in err
    assert extra["ondemand_node_hour_share"] == 1.0
    assert doc["totals"]["cost_usd"] / extra["node_hours"] == pytest.approx(ON_DEMAND)


@pytest.mark.parametrize("command", ["simulate", "train", "evaluate"])
def test_every_env_command_bills_spot_availability_at_spot_prices(tmp_path: Path, command: str) -> None:
    """The scenario path and the fleet-file path agree: spot availability, spot prices."""
    from atoll.control.cli.common import make_env
    from atoll.solvers.catalog import load_catalog

    path = spot_fleet(tmp_path)
    doc = yaml.safe_load(path.read_text())
    doc["regions"] = [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4"]}]  # on-demand
    doc["availability"] = {"static": {"aws:us-east-2/1xL4": 4}}
    path.write_text(yaml.safe_dump(doc))
    offers = load_catalog().offers_in("aws:us-east-2")
    for argv, spot in ((["--availability", "spot"], True), ([], False)):
        args = build_parser().parse_args([command, "--fleet", str(path), *argv])
        prices = make_env(args, (4, 4)).fleet.prices
        region = "aws:us-east-2~spot" if spot else "aws:us-east-2"
        assert prices == {(region, c): offers[c].price(spot=spot) for c in offers if c.endswith("xL4")}
    args = build_parser().parse_args([command, "--fleet", str(path), "--availability", "spot", "--prices",
                                      "on-demand"])
    with pytest.raises(AtollError, match="--prices on-demand does not apply to --availability spot"):
        make_env(args, (4, 4))


def test_prices_with_the_fleets_market_are_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = _run(capsys, "simulate", "--fleet", str(spot_fleet(tmp_path)), "--prices", "on-demand")
    assert code == 2 and "bills each pool at its own tier (spot)" in doc["error"]["message"]
    code, doc, _ = _run(capsys, "simulate", "--scenario", "core", "--availability", "market")
    assert code == 2 and "a fleet file's own market per pool" in doc["error"]["message"]


def test_solve_prints_a_bill_at_the_pools_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = str(spot_fleet(tmp_path, market="hedged", ondemand_quota={"lab:rack-1/1xL4": 1}))
    code, doc, _ = _run(capsys, "solve", "--fleet", fleet)
    assert code == 0 and doc["availability"] == "market" and doc["market"] == "hedged"
    assert {r["tier"] for r in doc["plan"]} == {"spot"} and {b["tier"] for b in doc["bill"]} == {"spot"}
    assert sum(b["cost_per_hour"] for b in doc["bill"]) == pytest.approx(doc["cost_per_hour"])
    assert all(b["cost_per_hour"] == pytest.approx(b["nodes"] * SPOT) for b in doc["bill"])
    code, doc, _ = _run(capsys, "solve", "--fleet", fleet, "--availability", "ample")
    assert code == 0 and {b["tier"] for b in doc["bill"]} == {"on-demand"}
    assert doc["cost_per_hour"] == pytest.approx(sum(b["nodes"] for b in doc["bill"]) * ON_DEMAND)


def test_simulate_plots_cost_vs_slo_and_nodes_by_tier_with_preemptions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib

    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text, so the picture can be read back
    fleet = str(spot_fleet(tmp_path, market="hedged", ondemand_quota={"lab:rack-1/1xL4": 1}))
    code, doc, _ = _run(capsys, "simulate", "--fleet", fleet, "--days", "4-5", "--policy", "fixed:1,never",
                        "--plot", str(tmp_path / "run.svg"))
    assert code == 0 and set(doc["plots"]) == {"capacity", "cost_slo", "tiers"}
    scatter = Path(doc["plots"]["cost_slo"]).read_text()
    assert "fixed:1" in scatter and "never" in scatter and "SLO attainment" in scatter
    tiers = Path(doc["plots"]["tiers"]).read_text()
    lost = int(sum(p["extra"]["preemptions"] for p in doc["policies"].values() if p["extra"]["preemptions"]))
    assert "spot nodes" in tiers and "on-demand nodes" in tiers and lost > 0 and "preemption (" in tiers


def test_solve_decompose_draws_the_ladder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import matplotlib

    matplotlib.rcParams["svg.fonttype"] = "none"
    fleet = str(spot_fleet(tmp_path))
    code, doc, _ = _run(capsys, "solve", "--fleet", fleet, "--plot", str(tmp_path / "l.svg"))
    assert code == 2 and "--plot draws the ladder of --decompose" in doc["error"]["message"]
    main(["solve", "--fleet", fleet, "--decompose", "--plot", str(tmp_path / "l.svg"), "--json"])
    doc = json.loads(capsys.readouterr().out)
    picture = Path(doc["plot"]).read_text()
    assert all(r["rung"] in picture for r in doc["rungs"]) and "$/h per rung" in picture


def test_overrides_say_what_they_did_and_name_the_fix(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    fleet = str(spot_fleet(tmp_path, market="on-demand", traces={}, static={"lab:rack-1/1xL4": 4}))
    code, doc, err = _run(capsys, "solve", "--fleet", fleet, "--availability", "scarce")
    assert code == 0 and doc["availability"] == "scarce"
    assert "capped at (1 + headroom)" in doc["availability_means"]
    assert "--availability scarce overrides the fleet file's market (on-demand)" in err
    assert "availability scarce: every pool on-demand, capped" in err
    # spot or hedged on a region of the user's own without a trace: the error says what to give
    for command in ("solve", "simulate"):
        code, doc, _ = _run(capsys, command, "--fleet", fleet, "--availability", "hedged",
                            *(["--days", "4"] if command == "simulate" else []))
        if command == "solve":  # a static plan needs no trace: both tiers at the pool's cap
            assert code == 0 and {b["tier"] for b in doc["bill"]} <= {"spot", "on-demand"}
        else:
            assert code == 2 and "lab:rack-1/1xL4 have no availability trace" in doc["error"]["message"]
            assert "availability.traces" in doc["error"]["message"]
