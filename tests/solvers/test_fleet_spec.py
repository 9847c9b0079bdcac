"""Fleet files: a valid file parses; every kind of mistake names the file, the entry and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.solvers.fleet import FleetFileError, load_fleet

BASE: dict[str, Any] = {
    "name": "acme",
    "models": ["Phi-4-14B", {"name": "Acme-8B", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8,
                             "head_dim": 128, "params_b": 8.0, "active_params_b": 8.0,
                             "bytes_per_param": 2, "slo": {"ttft_ms": 800, "tpot_ms": 40}}],
    "gpus": [{"name": "MI300X", "memory_gb": 192, "hbm_bandwidth_gbs": 5300, "bf16_tflops": 1307,
              "link_gbs": 448}],
    "regions": [{"name": "aws:us-east-2", "catalog": True, "gpu_types": ["L4", "L40S"]},
                {"name": "lab:rack-1", "offers": [{"config": "8xMI300X", "on_demand": 28.0, "spot": 11.0}]}],
    "availability": {"static": {"aws:us-east-2/4xL4": 6, "lab:rack-1/8xMI300X": 2}},
    "workloads": {"Phi-4-14B": {"source": "servegen:m-large", "mean_rate": 2.0},
                  "Acme-8B": {"source": "csv:log.csv#acme", "scale": 3}},
    "kubernetes": {"namespace": "llm"},
}


def write(tmp_path: Path, doc: Any) -> Path:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def changed(path: str, value: Any) -> dict[str, Any]:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    cur = doc
    parts = path.split(".")
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    last = parts[-1]
    if value is KeyError:
        del cur[int(last) if isinstance(cur, list) else last]
    elif isinstance(cur, list):
        cur[int(last)] = value
    else:
        cur[last] = value
    return doc


def test_a_valid_fleet_file(tmp_path: Path) -> None:
    spec = load_fleet(write(tmp_path, BASE))
    assert spec.name == "acme" and spec.runtime == "vllm"
    assert spec.model_names == ("Phi-4-14B", "Acme-8B") and [m.name for m in spec.user_models] == ["Acme-8B"]
    assert spec.regions == ("aws:us-east-2", "lab:rack-1")
    cells = {(o.region, o.config): o for o in spec.offers}
    assert ("aws:us-east-2", "4xL4") in cells and ("aws:us-east-2", "1xA10G") not in cells
    assert cells[("lab:rack-1", "8xMI300X")].spot_per_hour == 11.0
    assert spec.availability == {("aws:us-east-2", "4xL4"): 6, ("lab:rack-1", "8xMI300X"): 2}
    acme = next(w for w in spec.workloads if w.model == "Acme-8B")
    assert acme.scale == 3 and acme.mean_rate is None
    assert acme.source == f"csv:{(tmp_path / 'log.csv').resolve()}#acme"  # relative to the file


@pytest.mark.parametrize(("path", "value", "message"), [
    ("name", "Acme Corp", r"name: must be lowercase"),
    ("runtime", "sglang", r"runtime: must be one of vllm, any"),
    ("models.0", "Phi-9", r"models\[0\]: unknown model 'Phi-9'"),
    ("models.1.slo", KeyError, r"models\[1\] \('Acme-8B'\): field 'slo'"),
    ("models.1.layers", -4, r"models\[1\] \('Acme-8B'\): .*'layers' must be >= 1"),
    ("models.1.heads", "many", r"models\[1\] \('Acme-8B'\): .*'heads' must be an integer"),
    ("gpus.0.memory_gb", KeyError, r"gpus\[0\] \('MI300X'\): missing field\(s\) \['memory_gb'\]"),
    ("regions.0.name", "aws:mars-1",
     r"regions\[0\] \('aws:mars-1'\): field 'name': the catalog has no region"),
    ("regions.0.gpu_types", ["B300"], r"regions\[0\].*field 'gpu_types': unknown GPU type 'B300'"),
    ("regions.1.offers.0.on_demand", -3,
     r"regions\[1\] \('lab:rack-1'\) offers\[0\]: field 'on_demand' must be"),
    ("regions.1.offers.0.config", "3xMI300X", r"offers\[0\]: field 'config' must be '<count>x<GPU>'"),
    ("regions.1.offers.0.config", "8xMI400X", r"offers\[0\]: field 'config': unknown GPU type 'MI400X'"),
    ("availability.static", {"aws:us-east-2/8xH100": 2}, r"availability.static\['aws:us-east-2/8xH100'\]: .* "
                                                           r"not an offered region/config"),
    ("availability.static", {"aws:us-east-2/4xL4": -1},
     r"availability.static.*field 'nodes' must be a whole"),
    ("availability.static", {"aws:us-east-2/4xL4": 2.5}, r"field 'nodes' must be a whole number"),
    ("workloads.Acme-8B", KeyError, r"workloads: no workload for model 'Acme-8B'"),
    ("workloads.Llama-9", {"source": "servegen:m-mid"}, r"workloads\['Llama-9'\]: names no model"),
    ("workloads.Acme-8B.scale", 0, r"workloads\['Acme-8B'\]: field 'scale' must be a number > 0"),
    ("workloads.Acme-8B.mean_rate", 2, r"at most one of 'scale' and 'mean_rate'"),
    ("workloads.Acme-8B.source", 7, r"workloads\['Acme-8B'\]: field 'source' must be a workload"),
    ("colour", "blue", r"top level: unknown key 'colour'"),
])
def test_mistakes_name_the_file_entry_and_field(tmp_path: Path, path: str, value: Any, message: str) -> None:
    file = write(tmp_path, changed(path, value))
    with pytest.raises(FleetFileError, match=message) as info:
        load_fleet(file)
    assert str(file) in str(info.value)


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(FleetFileError, match="file not found"):
        load_fleet(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed\n")
    with pytest.raises(FleetFileError, match="cannot be read as YAML"):
        load_fleet(bad)
    with pytest.raises(FleetFileError, match="top level: must be a mapping"):
        load_fleet(write(tmp_path, ["a", "list"]))


def test_the_bundled_scenarios_ship_as_fleet_files() -> None:
    from atoll.solvers.fleet import bundled_fleets
    from atoll.solvers.scenarios import SCENARIOS

    assert set(bundled_fleets()) == {"core", "extended"}
    for name in ("core", "extended"):
        spec = load_fleet(name)
        scenario = SCENARIOS[name]
        assert spec.model_names == scenario.models and spec.regions == scenario.regions
        assert set(spec.gpu_types) == set(scenario.gpu_types) and spec.runtime == "any"
        assert {w.mean_rate for w in spec.workloads} == {scenario.req_per_s}


def test_pool_traces_parse_and_their_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "l4.csv").write_text("time_s,nodes\n0,4\n3600,0\n7200,2\n")
    doc = changed("availability", {"static": {"lab:rack-1/8xMI300X": 2},
                                   "traces": {"aws:us-east-2/4xL4": "l4.csv"}})
    spec = load_fleet(write(tmp_path, doc))
    ((cell, trace),) = spec.pool_traces
    assert cell == ("aws:us-east-2", "4xL4")
    assert [trace.at(t) for t in (0, 3599, 3600, 7199, 7200, 1e9)] == [4, 4, 0, 0, 2, 2]
    for text, message in (("time,n\n0,1\n", "line 1 must be the header 'time_s,nodes'"),
                          ("time_s,nodes\n5,1\n", "the first row must be at time_s 0"),
                          ("time_s,nodes\n0,1\n0,2\n", "line 3: time_s 0 must be >= 0 and increasing"),
                          ("time_s,nodes\n0,1.5\n", "line 2: nodes '1.5' must be a whole number"),
                          ("time_s,nodes\n0,x\n", "line 2 '0,x' must be two numbers")):
        (tmp_path / "l4.csv").write_text(text)
        where = r"availability.traces\['aws:us-east-2/4xL4'\]: .*"
        with pytest.raises(FleetFileError, match=where + message):
            load_fleet(write(tmp_path, doc))
