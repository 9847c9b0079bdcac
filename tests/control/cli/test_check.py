"""``atoll check --fleet`` and a user's fleet file through the command line: what
was read and corrected is said, an unusable fleet exits 2 naming why, flags the fleet overrides
are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from atoll.control.cli import main
from atoll.envs.fleet_file import fleet_config, read_fleet
from atoll.solvers.errors import AtollError

T0 = 1714521600
ACME = {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "head_dim": 128,
        "params_b": 8.0, "active_params_b": 8.0, "bytes_per_param": 2, "slo": {"ttft_ms": 800, "tpot_ms": 40}}
TINY = {"name": "Tiny-0.5B", "layers": 24, "hidden": 896, "heads": 14, "kv_heads": 2, "head_dim": 64,
        "params_b": 0.49, "active_params_b": 0.49, "bytes_per_param": 2,
        "slo": {"ttft_ms": 800, "tpot_ms": 40}}


def _log(path: Path, days: float = 5.0, rate: float = 0.01, extra: str = "") -> list[str]:
    rng = np.random.default_rng(1)
    rows = []
    for m in ("acme", "tiny"):
        for t in np.sort(rng.uniform(0, days * 86400, int(rate * days * 86400))):
            rows.append(f"{T0 + t:.3f},{m},{int(rng.integers(50, 900))},{int(rng.integers(5, 300))}\n")
    path.write_text("timestamp,model,input_tokens,output_tokens\n" + extra + "".join(rows))
    return rows


def _fleet(tmp_path: Path, **changes: Any) -> Path:
    doc: dict[str, Any] = {
        "name": "acme", "models": [ACME, TINY],
        "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4"]}],
        "workloads": {"Acme-8B": {"source": "csv:log.csv#acme", "mean_rate": 2.0},
                      "Tiny-0.5B": {"source": "csv:log.csv#tiny", "scale": 10}},
    }
    doc.update(changes)
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    code = main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_reports_per_model_what_was_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _log(tmp_path / "log.csv", extra="0,acme,1,1\n")  # an unset clock at line 2
    # a collector down for 8 hours on day 3, and one chunk pasted twice
    kept = [r for r in rows if not T0 + 2.2 * 86400 < float(r.split(",")[0]) < T0 + 2.2 * 86400 + 8 * 3600]
    (tmp_path / "log.csv").write_text("timestamp,model,input_tokens,output_tokens\n0,acme,1,1\n"
                                      + "".join(kept[:500] + kept[200:500] + kept[500:]))
    code, doc = _run(capsys, "check", "--fleet", str(_fleet(tmp_path)))
    assert code == 0 and doc["ok"] and doc["days"] == 5
    acme = next(m for m in doc["models"] if m["model"] == "Acme-8B")
    assert acme["isolated_rows_dropped"] == 1 and acme["isolated_lines"] == [2]
    assert acme["copied_rows_dropped"] == 300 and acme["servable"]
    assert len(acme["gaps"]) == 1 and 7.5 < acme["gaps"][0]["hours"] <= 8.1
    assert acme["mean_rate_planned"] == pytest.approx(2.0)
    assert acme["mean_rate_gaps_as_zero"] < acme["mean_rate"]
    assert "mean:2" in acme["scaling"] and "gaps left out" in acme["scaling"]
    text = " ".join(doc["warnings"])
    assert "line(s) 2" in text and "copies line" in text and "gap" in text


def test_check_exits_2_naming_an_unservable_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(tmp_path / "log.csv")
    rack = {"name": "rack", "gpus": [{"name": "MI300X", "memory_gb": 192, "hbm_bandwidth_gbs": 5300,
                                       "bf16_tflops": 1307, "link_gbs": 448}],
            "regions": [{"name": "lab:rack-1", "offers": [{"config": "8xMI300X", "on_demand": 28.0}]}]}
    code, doc = _run(capsys, "check", "--fleet", str(_fleet(tmp_path, **rack)))
    assert code == 0 and doc["ok"]  # slices (the vllm default): Tiny runs on 1 or 2 of the 8 GPUs
    fleet = _fleet(tmp_path, slices=False, **rack)
    code, doc = _run(capsys, "check", "--fleet", str(fleet))
    assert code == 2 and not doc["ok"]
    tiny = next(m for m in doc["models"] if m["model"] == "Tiny-0.5B")
    acme = next(m for m in doc["models"] if m["model"] == "Acme-8B")
    assert acme["servable"]  # 8B on 8xMI300X: the rho cut no longer removes its one-node template
    assert not tiny["servable"] and "heads do not split" in tiny["unservable_reason"]
    assert "slices" in tiny["unservable_reason"]  # the fix a whole-node vllm fleet needs first
    # simulate refuses before simulating; solve names the reason and the flag
    code, err = _run(capsys, "simulate", "--fleet", str(fleet), "--days", "4", "--forecaster", "naive")
    assert code == 2 and "Tiny-0.5B cannot be served: its heads do not split" in err["error"]["message"]
    code, solved = _run(capsys, "solve", "--fleet", str(fleet))
    assert code == 1 and "Tiny-0.5B cannot be served" in solved["message"]
    assert "--goodput" in solved["message"] and "mode='goodput' to" not in solved["message"]
    assert "heads do not split" in solved["unservable"]["Tiny-0.5B"]


def test_check_names_a_duplicate_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(tmp_path / "log.csv")
    path = _fleet(tmp_path)
    path.write_text(path.read_text() + "name: other\n")
    code, doc = _run(capsys, "check", "--fleet", str(path))
    assert code == 2 and "key 'name' is given twice" in doc["error"]["message"]


@pytest.mark.parametrize("flags", [["--workload", "servegen:m-large"], ["--scale", "mean:3"],
                                   ["--scenario", "core"]])
def test_flags_the_fleet_overrides_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               flags: list[str]) -> None:
    _log(tmp_path / "log.csv")
    code, doc = _run(capsys, "simulate", "--fleet", str(_fleet(tmp_path)), *flags)
    assert code == 2 and f"drop {flags[0]}" in doc["error"]["message"]
    if flags[0] == "--scenario":
        code, doc = _run(capsys, "solve", "--fleet", str(_fleet(tmp_path)), *flags)
        assert code == 2 and "drop --scenario" in doc["error"]["message"]


def test_the_workload_echoed_is_the_fleets(tmp_path: Path) -> None:
    from atoll.control.cli import build_parser
    from atoll.control.cli.common import read_fleet_arg, workloads_used

    _log(tmp_path / "log.csv")
    args = build_parser().parse_args(["simulate", "--fleet", str(_fleet(tmp_path))])
    assert workloads_used(args) == "servegen"  # before it is loaded: the option's value
    read_fleet_arg(args)
    used = workloads_used(args)
    assert isinstance(used, dict) and used["Acme-8B"].startswith("csv:") and "mean:2" in used["Acme-8B"]
    assert "factor:10" in used["Tiny-0.5B"]


def test_days_without_a_models_requests_are_refused(tmp_path: Path) -> None:
    rows = _log(tmp_path / "log.csv")
    # tiny stops after day 3; acme runs all 5 days
    cut = [r for r in rows if ",tiny," not in r or float(r.split(",")[0]) < T0 + 3 * 86400]
    (tmp_path / "log.csv").write_text("timestamp,model,input_tokens,output_tokens\n" + "".join(cut))
    active = read_fleet(_fleet(tmp_path))
    with pytest.raises(AtollError, match=r"day\(s\) 4, 5 hold no requests of 'Tiny-0.5B' \(its data: days 1-3"
                       ):
        fleet_config(active, (4, 5))
    fleet_config(active, (2, 3))


def test_availability_trace_in_milliseconds_is_refused(tmp_path: Path) -> None:
    _log(tmp_path / "log.csv")
    (tmp_path / "pool.csv").write_text("time_s,nodes\n0,4\n172800000,1\n")  # day 2, in ms
    fleet = _fleet(tmp_path, availability={"traces": {"aws:us-east-2/1xL4": "pool.csv"},
                                           "markets": {"aws:us-east-2/1xL4": "spot"}})
    with pytest.raises(AtollError, match="look like milliseconds"):
        read_fleet(fleet)
    (tmp_path / "pool.csv").write_text("time_s,nodes\n0,4\n172800,1\n")
    read_fleet(fleet)


def test_check_lists_the_pools_and_warns_for_gpu_types_a_region_does_not_sell(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from rich.cells import cell_len

    _log(tmp_path / "log.csv")
    (tmp_path / "pool.csv").write_text("time_s,event,nodes\n0,capacity,4\n3600,preempt,1\n")
    regions = [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "A100-80GB"]},
               {"name": "lab:rack-1", "market": "hedged",
                "offers": [{"config": "1xL4", "on_demand": 1.0, "spot": 0.4}]}]
    fleet = _fleet(tmp_path, regions=regions,
                   availability={"traces": {"lab:rack-1/1xL4": "pool.csv"},
                                 "static": {"aws:us-east-2/4xL4": 3},
                                 "ondemand_quota": {"lab:rack-1/1xL4": 2}})
    code, doc = _run(capsys, "check", "--fleet", str(fleet), "--no-templates")
    assert code == 0 and doc["market"] == "mixed (hedged, on-demand)"
    pools = {(p["region"], p["config"]): p for p in doc["pools"]}
    lab = pools[("lab:rack-1", "1xL4")]
    assert (lab["market"], lab["on_demand_per_hour"], lab["spot_per_hour"], lab["cap"],
            lab["ondemand_quota"]) == ("hedged", 1.0, 0.4, 4, 2) and lab["trace"].endswith("pool.csv")
    l4 = pools[("aws:us-east-2", "4xL4")]
    assert (l4["market"], l4["spot_per_hour"], l4["cap"], l4["trace"]) == ("on-demand", None, 3, "-")
    assert pools[("aws:us-east-2", "1xL4")]["cap"] == 0  # a static section: pools left out get none
    assert any("aws:us-east-2 does not sell A100-80GB" in w for w in doc["warnings"])
    assert main(["check", "--fleet", str(fleet), "--no-templates"]) == 0
    out = capsys.readouterr().out
    assert "lab:rack-1" in out and max(cell_len(line) for line in out.splitlines() if "│" in line) <= 100


def test_check_fails_for_a_model_without_weights_when_a_kubernetes_sink_will_deploy_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _log(tmp_path / "log.csv")
    code, doc = _run(capsys, "check", "--fleet", str(_fleet(tmp_path)), "--no-templates")
    assert code == 0 and any("no weights source for Acme-8B, Tiny-0.5B" in w for w in doc["warnings"])
    fleet = _fleet(tmp_path, kubernetes={"namespace": "llm", "model_sources": {"Acme-8B": "acme/8b"}})
    code, doc = _run(capsys, "check", "--fleet", str(fleet), "--no-templates")
    assert code == 2 and not doc["ok"]
    assert doc["errors"] == [e for e in doc["errors"] if "no weights source for Tiny-0.5B" in e] != []
