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

    assert set(bundled_fleets()) == {"core", "extended", "fleet20"} == set(SCENARIOS)
    for name in ("core", "extended", "fleet20"):
        spec = load_fleet(name)
        scenario = SCENARIOS[name]
        assert spec.name == name and spec.model_names == scenario.models and spec.regions == scenario.regions
        assert spec.listed_gpu_types == scenario.gpu_types and set(spec.gpu_types) == set(scenario.gpu_types)
        assert spec.runtime == "any" and spec.request_traces == scenario.traces == ("code", "conv")
        assert {w.mean_rate for w in spec.workloads} == {scenario.req_per_s}
        assert spec.scarce_headroom == scenario.scarce_headroom


def test_request_shapes_and_scarce_headroom_parse_and_their_errors_name_the_field(tmp_path: Path) -> None:
    spec = load_fleet(write(tmp_path, BASE))
    assert spec.request_traces == () and spec.scarce_headroom == 0.25  # the defaults
    assert spec.listed_gpu_types == ("L4", "L40S")
    for value, traces in (("workloads", ()), ("conv", ("conv",)),
                          (["conv", "code", "conv"], ("conv", "code", "conv"))):
        assert load_fleet(write(tmp_path, changed("request_shapes", value))).request_traces == traces
    assert load_fleet(write(tmp_path, changed("scarce_headroom", 0))).scarce_headroom == 0.0
    for bad in ("azure", [], ["code", "chat"], {"code": 1}, 3):
        with pytest.raises(FleetFileError, match=r"fleet.yaml: request_shapes: must be 'workloads' .*code"):
            load_fleet(write(tmp_path, changed("request_shapes", bad)))
    for bad in (-0.1, "a lot", True):
        with pytest.raises(FleetFileError, match="scarce_headroom: field 'scarce_headroom' must be a number"):
            load_fleet(write(tmp_path, changed("scarce_headroom", bad)))


def test_a_fleet_file_read_as_a_scenario_refuses_what_a_scenario_cannot_hold(tmp_path: Path) -> None:
    from atoll.solvers.scenarios import SCENARIOS, scenario_from_fleet

    core = yaml.safe_load(Path(load_fleet("core").path).read_text())
    spec = scenario_from_fleet(load_fleet(write(tmp_path, {**core, "name": "core-copy"})))
    assert spec == SCENARIOS["core"].__class__(**{**SCENARIOS["core"].__dict__, "name": "core-copy"})
    for key, value, said in (
            ("models", BASE["models"], "models: a bundled scenario plans catalog models"),
            ("gpus", BASE["gpus"], "gpus: a bundled scenario plans the catalog's GPU types"),
            ("regions", [*core["regions"], {"name": "lab:rack-1", "offers": [{"config": "8xL4",
                                                                               "on_demand": 9}]}],
             "regions: a bundled scenario buys at catalog"),
            ("availability", {"static": {"aws:us-east-2/4xL4": 6}}, "availability: a bundled scenario takes"),
            ("removal_weight", 0.5, "removal_weight: a bundled scenario"),
            ("request_shapes", "workloads", "request_shapes: a bundled scenario plans with the Azure"),
            ("workloads", {**core["workloads"], "Qwen3-32B": {"source": "servegen:m-small", "scale": 2}},
             "workloads: a bundled scenario has one mean_rate")):
        doc = {**core, key: value}
        if key == "models":
            doc.update(gpus=BASE["gpus"], workloads=BASE["workloads"])
        with pytest.raises(FleetFileError, match=said):
            scenario_from_fleet(load_fleet(write(tmp_path, doc)))


def test_pool_traces_parse_and_their_errors_name_the_line(tmp_path: Path) -> None:
    (tmp_path / "l4.csv").write_text("time_s,nodes\n0,4\n3600,0\n7200,2\n")
    doc = changed("availability", {"static": {"lab:rack-1/8xMI300X": 2},
                                   "markets": {"aws:us-east-2/4xL4": "spot"},
                                   "traces": {"aws:us-east-2/4xL4": "l4.csv"}})
    spec = load_fleet(write(tmp_path, doc))
    ((cell, trace),) = spec.pool_traces
    assert cell == ("aws:us-east-2", "4xL4")
    assert [trace.at(t) for t in (0, 3599, 3600, 7199, 7200, 1e9)] == [4, 4, 0, 0, 2, 2]
    for text, message in (("time,n\n0,1\n", "line 1 must be the header 'time_s,nodes'"),
                          ("time_s,nodes\n5,1\n", "the first row must be at time_s 0"),
                          ("time_s,nodes\n0,1\n0,2\n", "line 3: time_s 0 must be >= 0 and increasing"),
                          ("time_s,nodes\n0,1.5\n", "line 2: nodes '1.5' must be a whole number"),
                          ("time_s,nodes\n0,x\n", "line 2 '0,x' must be two numbers"),
                          ("time_s,event,nodes\n5,capacity,3\n",
                           "line 2: the first row must be '0,capacity,N'"),
                          ("time_s,event,nodes\n0,capacity,3\n9,lost,1\n", "line 3: unknown event 'lost'"),
                          ("time_s,event,nodes\n0,capacity,3\n9,preempt,4\n",
                           "line 3: preempts 4 node.s. at time_s 9 but the pool holds 3"),
                          ("time_s,event,nodes\n0,capacity,3\n9,preempt,1\n8,restore,1\n",
                           "line 4: time_s 8 must be >= 0 and in time order")):
        (tmp_path / "l4.csv").write_text(text)
        where = r"availability.traces\['aws:us-east-2/4xL4'\]: .*"
        with pytest.raises(FleetFileError, match=where + message):
            load_fleet(write(tmp_path, doc))



# Shapes of the fleet file fuzz target (tests/test_fuzz_inputs.py) that reach past the YAML parser:
# each must be a FleetFileError naming the key, never a bare traceback (UnicodeDecodeError,
# ValueError, TypeError, OverflowError) nor a silent misreading.
CORE = (Path(__file__).resolve().parents[2] / "solvers" / "data" / "fleets" / "core.yaml").read_text()
BIG = "9" * 400
MI = "hbm_bandwidth_gbs: 1, bf16_tflops: 1, link_gbs: 1"
POOL = "availability: {traces: {'aws:us-east-2/1xL4': %s}}\n"


@pytest.mark.parametrize(("text", "message"), [
    (b"\xff\xfename: x\n", r"not a text file \(byte 0 is not UTF-8\)"),
    ("name: 2024-13-01\n", r"cannot be read as YAML \(month must be in 1..12\)"),
    ("rho: !!int twelve\n", r"cannot be read as YAML \(invalid literal for int"),
    ("[" * 5000, r"cannot be read as YAML"),
    ("1: a\nx: b\n", r"top level: unknown key 'x'; valid keys"),  # keys of two types: no sort order
    (CORE + "gpus: 5\n", r"gpus: must be a list \(GPU types the catalog lacks\), got int"),
    (CORE + "gpus: [{1: a, name: X}]\n", r"gpus\[0\] \('X'\): field names must be text, got 1 \(int\)"),
    (CORE + f"gpus: [{{name: X, memory_gb: {BIG}, {MI}}}]\n",
     r"gpus\[0\] \('X'\): GpuType 'X': field 'memory_gb' must be finite and > 0"),
    (CORE + f"rho: {BIG}\n", r"rho: field 'rho' must be a number > 0, got 9{77}\.\.\."),
    (CORE + f"n_max: {BIG}\n", r"n_max: field 'n_max' must be a whole number >= 1"),
    (CORE + f"availability: {{static: {{'aws:us-east-2/1xL4': {BIG}}}}}\n",
     r"availability.static\['aws:us-east-2/1xL4'\]: field 'nodes' must be a whole number"),
    (CORE + POOL % '"a\\0b"', r"traces\['aws:us-east-2/1xL4'\]: must be the path of a CSV file .*'a\\x00b'"),
    (CORE + POOL % "7", r"traces\['aws:us-east-2/1xL4'\]: must be the path of a CSV file"),
    (CORE + POOL % "pool.csv", r"traces\['aws:us-east-2/1xL4'\]: trace file .*pool.csv is not UTF-8 text"),
])
def test_hostile_fleet_files_give_errors_naming_the_file(tmp_path: Path, text: str | bytes,
                                                         message: str) -> None:
    path = tmp_path / "fleet.yaml"
    (tmp_path / "pool.csv").write_bytes(b"\xfftime_s,nodes\n")
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(FleetFileError, match=message) as info:
        load_fleet(path)
    assert str(info.value).startswith(f"{path}: ")


def _edit(doc: dict[str, Any], where: str, key: Any, value: Any) -> dict[str, Any]:
    """``doc`` with ``value`` set under ``key`` in the entry at ``where`` (dotted, as ``changed``)."""
    cur: Any = doc
    for p in where.split("."):
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    cur[key] = value
    return doc


ACME_GPU = {"name": "mi300x", "memory_gb": 1, "hbm_bandwidth_gbs": 1, "bf16_tflops": 1, "link_gbs": 1}


@pytest.mark.parametrize(("where", "key", "value", "message"), [
    ("regions.0", "offers", 5, r"regions\[0\] \('aws:us-east-2'\) field 'offers': must be a list"),
    ("regions.0", "catalog", "false",
     r"regions\[0\] \('aws:us-east-2'\): field 'catalog' must be true or false, got 'false'"),
    ("regions.1", "gpu_types", ["L4"],
     r"regions\[1\] \('lab:rack-1'\): field 'gpu_types' .* needs 'catalog: true'"),
    ("regions.1.offers.0", "config", "9" * 5000 + "xMI300X",
     r"offers\[0\]: field 'config' must be '<count>x<GPU>'.*got '9{60}"),
    ("workloads.Phi-4-14B", "source", "csv:log\0.csv",
     r"workloads\['Phi-4-14B'\]: field 'source' must be a workload"),
    ("workloads", "phi-4", {"source": "servegen:m-mid"},
     r"workloads\['phi-4'\]: model 'Phi-4-14B' already has a workload \(under 'Phi-4-14B'\)"),
    ("models.1", "aliases", 5,
     r"models\[1\] \('Acme-8B'\): field 'aliases' must be a name or a list of names, got 5"),
    ("models.1", "aliases", [None], r"models\[1\] \('Acme-8B'\): field 'aliases' must be a name or a list"),
    ("models.1", "aliases", ["phi-4"],
     r"models\[1\] \('Acme-8B'\): the name 'phi-4' is already used by models\[0\] \('Phi-4-14B'\)"),
    ("models.1", "name", "phi-4-14b",
     r"models\[1\] \('phi-4-14b'\): the name 'phi-4-14b' is already used by models\[0\]"),
    ("gpus", 1, ACME_GPU, r"gpus\[1\] \('mi300x'\): the name 'mi300x' is already used by gpus\[0\]"),
    ("models.1", 3, 1, r"models\[1\] \('Acme-8B'\): field names must be text, got 3 \(int\)"),
])
def test_fuzz_found_mistakes_name_the_file_entry_and_field(tmp_path: Path, where: str, key: Any, value: Any,
                                                           message: str) -> None:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    if where == "gpus":
        doc["gpus"].append(value)
    else:
        _edit(doc, where, key, value)
    file = write(tmp_path, doc)
    with pytest.raises(FleetFileError, match=message) as info:
        load_fleet(file)
    assert str(file) in str(info.value)


def test_a_single_alias_is_one_alias_and_workloads_may_name_a_model_by_it(tmp_path: Path) -> None:
    doc = changed("models.1.aliases", "acme")
    doc["workloads"]["acme"] = doc["workloads"].pop("Acme-8B")
    spec = load_fleet(write(tmp_path, doc))
    assert spec.user_models[0].aliases == ("acme",)  # not ('a', 'c', 'm', 'e')
    assert {w.model for w in spec.workloads} == {"Phi-4-14B", "Acme-8B"}


def test_a_folder_is_not_a_fleet_file(tmp_path: Path) -> None:
    with pytest.raises(FleetFileError, match="is a folder"):
        load_fleet(tmp_path)


@pytest.mark.parametrize(("text", "key", "line"), [
    ("name: acme\nruntime: vllm\nruntime: any\n", "runtime", 3),
    ("name: acme\nmodels:\n  - name: X\n    layers: 32\n    layers: 40\n", "layers", 5),
    ("name: acme\navailability:\n  static: {a:b/1xL4: 2, a:b/1xL4: 3}\n", "a:b/1xL4", 3),
    ("name: acme\nworkloads:\n  A: {source: x}\n  B: {source: y}\n  A: {source: z}\n", "A", 5),
])
def test_a_key_given_twice_is_an_error_naming_key_and_line(tmp_path: Path, text: str, key: str,
                                                          line: int) -> None:
    # plain YAML keeps the last of two equal keys and drops the first without a word
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(FleetFileError, match=rf"fleet.yaml: line {line}: key '{key}' is given twice"):
        load_fleet(path)


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    doc = yaml.safe_dump(BASE)
    assert "kubernetes:\n  namespace: llm\n" in doc
    path = tmp_path / "fleet.yaml"
    path.write_text(doc.replace("kubernetes:\n  namespace: llm\n",
                                "kubernetes: {<<: {namespace: a, image: x}, namespace: llm}\n"))
    assert load_fleet(path).kubernetes == {"namespace": "llm", "image": "x"}


def test_a_spot_price_above_on_demand_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, changed("regions.1.offers.0.spot", 30.0))
    with pytest.raises(FleetFileError, match=r"offers\[0\]: field 'spot' \(30 .*above 'on_demand' \(28\)"):
        load_fleet(path)


def test_workload_gaps_mode_is_validated(tmp_path: Path) -> None:
    path = write(tmp_path, changed("workloads.Acme-8B.gaps", "skip"))
    with pytest.raises(FleetFileError, match=r"workloads\['Acme-8B'\]: field 'gaps' must be 'exclude'"):
        load_fleet(path)
    spec = load_fleet(write(tmp_path, changed("workloads.Acme-8B.gaps", "zero")))
    assert {w.model: w.gaps for w in spec.workloads} == {"Acme-8B": "zero", "Phi-4-14B": "exclude"}


def test_slices_are_read_and_need_the_vllm_runtime(tmp_path: Path) -> None:
    assert BASE.get("runtime", "vllm") == "vllm"
    assert load_fleet(write(tmp_path, BASE)).slices is True  # the vllm default
    assert load_fleet(write(tmp_path, changed("slices", False))).slices is False
    assert load_fleet(write(tmp_path, {**BASE, "runtime": "any"})).slices is False
    assert load_fleet(write(tmp_path, changed("slices", True))).slices is True
    with pytest.raises(FleetFileError, match=r"slices: field 'slices: true' needs 'runtime: vllm', got "
                                             r"runtime 'any'"):
        load_fleet(write(tmp_path, {**changed("slices", True), "runtime": "any"}))
    with pytest.raises(FleetFileError, match=r"slices: must be true or false, got 'yes'"):
        load_fleet(write(tmp_path, changed("slices", "yes")))


def test_a_sliced_fleet_threads_slices_to_its_library(tmp_path: Path) -> None:
    from atoll.envs.fleet_file import read_fleet
    from atoll.solvers.errors import InputError
    from atoll.solvers.scenarios import library_spec

    (tmp_path / "log.csv").write_text("timestamp,model,input_tokens,output_tokens\n"
                                      + "".join(f"{1714521600 + 60 * i},acme,500,100\n" for i in range(600)))
    doc = {**changed("slices", True), "workloads": {"Phi-4-14B": {"source": "csv:log.csv#acme"},
                                                    "Acme-8B": {"source": "csv:log.csv#acme"}}}
    fleet = read_fleet(write(tmp_path, doc))
    assert fleet.scenario.slices and library_spec(fleet.scenario).slices
    assert not library_spec(fleet.scenario, slices=False).slices
    assert not library_spec(fleet.scenario, runtime="any").slices  # the research runtime: whole nodes
    with pytest.raises(InputError, match=r"slices needs runtime 'vllm', got runtime 'any'"):
        library_spec(fleet.scenario, runtime="any", slices=True)


def test_a_preemption_log_reads_as_the_same_levels_as_its_trace(tmp_path: Path) -> None:
    """The two trace formats of one pool's history give one trace (a metamorphic pair)."""
    doc = changed("availability", {"markets": {"aws:us-east-2/4xL4": "spot"},
                                   "traces": {"aws:us-east-2/4xL4": "l4.csv"}})
    (tmp_path / "l4.csv").write_text("time_s,nodes\n0,4\n3600,1\n7200,3\n")
    levels = load_fleet(write(tmp_path, doc)).pool_traces[0][1]
    (tmp_path / "l4.csv").write_text("time_s,event,nodes\n0,capacity,4\n3600,preempt,2\n3600,preempt,1\n"
                                     "7200,restore,2\n")
    events = load_fleet(write(tmp_path, doc)).pool_traces[0][1]
    assert (events.times_s, events.nodes) == (levels.times_s, levels.nodes)


def test_markets_per_region_and_pool(tmp_path: Path) -> None:
    doc = changed("regions.1.market", "hedged")
    doc["regions"][0]["market"] = "spot"
    doc["availability"]["markets"] = {"aws:us-east-2/4xL4": "on-demand"}
    doc["availability"]["ondemand_quota"] = {"lab:rack-1/8xMI300X": 1}
    spec = load_fleet(write(tmp_path, doc))
    assert spec.market_of(("lab:rack-1", "8xMI300X")) == "hedged"
    assert spec.market_of(("aws:us-east-2", "1xL4")) == "spot"
    assert spec.market_of(("aws:us-east-2", "4xL4")) == "on-demand"
    assert spec.ondemand_quota == {("lab:rack-1", "8xMI300X"): 1}
    assert spec.market_summary == "mixed (hedged, on-demand, spot)"
    assert load_fleet(write(tmp_path, BASE)).market_summary == "on-demand"


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["regions"][0].update(market="preemptible"),
     r"regions\[0\] \('aws:us-east-2'\): field 'market' must be one of on-demand, spot, hedged"),
    (lambda d: d["availability"].update(ondemand_quota={"lab:rack-1/8xMI300X": 1}),
     r"ondemand_quota\['lab:rack-1/8xMI300X'\]: .* is in the on-demand market; set its market to hedged"),
    (lambda d: d["availability"].update(traces={"aws:us-east-2/1xL4": "x.csv"}),
     r"traces\['aws:us-east-2/1xL4'\]: a trace moves a spot pool .*set 'market: spot'"),
    (lambda d: (d["regions"][1].update(market="spot"), d["regions"][1]["offers"][0].pop("spot")),
     r"regions: pool\(s\) lab:rack-1/8xMI300X are in a spot or hedged market but have no spot price"),
])
def test_market_mistakes_name_the_pool_and_the_fix(tmp_path: Path, edit: Any, message: str) -> None:
    doc = yaml.safe_load(yaml.safe_dump(BASE))
    edit(doc)
    with pytest.raises(FleetFileError, match=message):
        load_fleet(write(tmp_path, doc))


def test_gpu_types_a_region_does_not_sell_are_recorded(tmp_path: Path) -> None:
    doc = changed("regions.0.gpu_types", ["L4", "L40S", "A100-80GB"])
    assert load_fleet(write(tmp_path, doc)).unsold == (("aws:us-east-2", "A100-80GB"),)


def test_pd_one_mode_or_per_model_and_its_mistakes(tmp_path: Path) -> None:
    assert load_fleet(write(tmp_path, BASE)).pd == "auto"  # the default
    spec = load_fleet(write(tmp_path, changed("pd", "auto")))
    assert (spec.pd, spec.model_pd) == ("auto", ())
    spec = load_fleet(write(tmp_path, changed("pd", {"default": "auto", "acme-8b": "disaggregated",
                                                      "Phi-4-14B": "auto"})))
    assert (spec.pd, spec.model_pd) == ("auto", (("Acme-8B", "disaggregated"),))  # by alias-insensitive name
    for value, message in (("both", "pd: must be one of auto, aggregated, disaggregated"),
                           ({"default": "split"}, r"pd\[default\]: must be one of"),
                           ({"Nope-1B": "auto"}, r"pd\['Nope-1B'\]: names no model of this fleet")):
        with pytest.raises(FleetFileError, match=message):
            load_fleet(write(tmp_path, changed("pd", value)))
