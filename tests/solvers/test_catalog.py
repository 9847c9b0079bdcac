"""Catalog: spot-checked prices, reproducible table, user files, unknown names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from user_models import ACME_8B, models_yaml

from atoll.solvers.build_catalog import build
from atoll.solvers.catalog import (
    DEFAULT_GPU_TYPES,
    DEFAULT_REGIONS,
    CatalogFileError,
    load_catalog,
    load_user_file,
)
from atoll.solvers.models import DEFAULT_MODELS, get_model
from atoll.solvers.paths import CATALOG_PATH

CATALOG = load_catalog()


def test_default_catalog_shape() -> None:
    assert set(DEFAULT_REGIONS) <= set(CATALOG.regions)
    assert len(CATALOG.configs(DEFAULT_GPU_TYPES)) == 20
    for name in ("T4", "L4", "A10G", "L40S", "V100", "A100-40GB", "A100-80GB", "H100", "H200"):
        assert CATALOG.gpus[name].memory_gb > 0


def test_aws_prices_match_source_rows(shared_data: Path) -> None:
    rows = json.loads((shared_data / "aws-gpu-prices-vantage" / "all_gpu_instances.json").read_text())
    by_api = {r["apiName"]: r for r in rows if "apiName" in r}
    for config, api in (("1xL4", "g6.xlarge"), ("4xL40S", "g6e.12xlarge"), ("8xH100", "p5.48xlarge"),
                        ("1xA10G", "g5.xlarge")):
        offer = CATALOG.offer("aws:us-east-2", config)
        assert offer is not None and offer.instance == api
        assert offer.on_demand_per_hour == by_api[api]["pricing"]["us-east-2"]["onDemand"]
        assert offer.spot_estimated


def test_gcp_price_is_host_plus_gpu_row() -> None:
    # cloud-catalog-anycloud gcp/vms.csv, us-central1-a: A100 x1 2.93391 + a2-highgpu-1g 0.73948
    offer = CATALOG.offer("gcp:us-central1", "1xA100-40GB")
    assert offer is not None
    assert offer.on_demand_per_hour == pytest.approx(2.93391 + 0.73948)
    assert offer.spot_per_hour == pytest.approx(1.4341 + 0.36975)
    assert not offer.spot_estimated


def test_config_a_region_does_not_sell_is_absent() -> None:
    assert CATALOG.offer("aws:us-east-2", "2xL40S") is None  # AWS has no 2-GPU g6e node
    assert CATALOG.offer("gcp:us-central1", "1xA10G") is None  # A10G is AWS-only


def test_shipped_table_is_reproducible_from_shared_data(shared_data: Path) -> None:
    assert build(shared_data) == json.loads(CATALOG_PATH.read_text())


def test_missing_source_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "gpu-specs-epoch-ai")):
        build(tmp_path)


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(KeyError, match="valid GPU types: A100-40GB"):
        CATALOG.config("2xB300")
    with pytest.raises(KeyError, match="valid models: .*Phi-4-14B"):
        get_model("gpt-7")
    with pytest.raises(ValueError, match="'<count>x<GPU>'"):
        CATALOG.config("L4")
    assert get_model("phi-4").name == "Phi-4-14B"
    assert len(DEFAULT_MODELS) == 6


GOOD = """
gpus:
  - {name: MI300X, memory_gb: 192, hbm_bandwidth_gbs: 5300, bf16_tflops: 1307, link_gbs: 448}
models:
""" + models_yaml({**ACME_8B, "name": "My-8B"})


def test_user_file_yaml_and_toml(tmp_path: Path) -> None:
    y = tmp_path / "fleet.yaml"
    y.write_text(GOOD)
    gpus, models = load_user_file(y)
    assert gpus[0].name == "MI300X" and models[0].slo.tpot_ms == 40
    assert get_model("My-8B", models).layers == 32
    t = tmp_path / "fleet.toml"
    t.write_text('[[gpus]]\nname = "X1"\nmemory_gb = 16\nhbm_bandwidth_gbs = 400\n'
                 'bf16_tflops = 50\nlink_gbs = 16\n')
    assert load_user_file(t)[0][0].name == "X1"


@pytest.mark.parametrize(("edit", "pattern"), [
    (("hidden: 4096", ""), r"models\[0\] \('My-8B'\): missing field\(s\) \['hidden'\]"),
    (("params_b: 8.0", "params_b: -8.0"), r"models\[0\] \('My-8B'\): .*'params_b' must be"),
    (("layers: 32", "layers: thirty-two"), r"models\[0\] \('My-8B'\): .*'layers' must be an integer"),
    (("memory_gb: 192", "memory_gb: big"), r"gpus\[0\] \('MI300X'\): .*'memory_gb' must be a number"),
    (("link_gbs: 448", "link_gbs: 448, colour: red"), r"gpus\[0\].*unknown field\(s\) \['colour'\]"),
])
def test_user_file_errors_name_file_entry_field(tmp_path: Path, edit: tuple[str, str],
                                                 pattern: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(GOOD.replace(*edit))
    with pytest.raises(CatalogFileError, match=str(f) + ".*" + pattern):
        load_user_file(f)


def test_user_file_missing(tmp_path: Path) -> None:
    with pytest.raises(CatalogFileError, match="nope.yaml: file not found"):
        load_user_file(tmp_path / "nope.yaml")


@pytest.mark.parametrize(("content", "pattern"), [
    (b"\x89PNG\r\n\x1a\n\x00\xff\xfe", r"not a text file"),
    (b"gpus: {name: X1, memory_gb: 16}\n", r"'gpus' must be a list of entries"),
    (b"models: 5\n", r"'models' must be a list"),
    (b"gpus:\n  - {1: a, name: X1}\n", r"gpus\[0\] \('X1'\): field names must be text, got 1"),
    (b"- a\n- b\n", r"top level must be a mapping .* got list"),
    (b"{1: a, gpus: []}\n", r"unknown top-level keys \[1\]"),
    (b"gpus: [" * 2000, r"not valid YAML"),
])
def test_malformed_user_file_shapes_are_errors_naming_the_file(tmp_path: Path, content: bytes,
                                                               pattern: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_bytes(content)
    with pytest.raises(CatalogFileError, match=str(f) + ".*" + pattern):
        load_user_file(f)


def test_user_file_folder_duplicates_builtin_names_and_string_aliases(tmp_path: Path) -> None:
    from atoll.solvers.catalog import load_catalog, with_user_gpus

    with pytest.raises(CatalogFileError, match="is a folder"):
        load_user_file(tmp_path)
    gpu = "{name: X1, memory_gb: 16, hbm_bandwidth_gbs: 400, bf16_tflops: 50, link_gbs: 16}"
    f = tmp_path / "dup.yaml"
    f.write_text(f"gpus:\n  - {gpu}\n  - {gpu}\n")
    with pytest.raises(CatalogFileError, match=r"gpus\[1\] \('X1'\): the name 'X1' is already used by "
                                               r"gpus\[0\]"):
        load_user_file(f)
    f.write_text(GOOD.replace("name: MI300X", "name: h100"))
    gpus, _ = load_user_file(f)
    with pytest.raises(CatalogFileError, match="named like the built-in 'H100'.*--override-gpus"):
        with_user_gpus(load_catalog(), gpus)
    replaced = with_user_gpus(load_catalog(), gpus, override=True)
    assert replaced.gpus["H100"].memory_gb == 192 and "H100" not in replaced.gpus  # case-insensitively one
    f.write_text(GOOD + "    aliases: phi-4\n")
    assert load_user_file(f)[1][0].aliases == ("phi-4",)
