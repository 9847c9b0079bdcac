"""``atoll catalog``, ``atoll perf table``, ``atoll perf calibrate``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from atoll.control.output import UserError, console, emit_json
from atoll.solvers.catalog import (
    DEFAULT_GPU_TYPES,
    DEFAULT_REGIONS,
    Catalog,
    CatalogFileError,
    load_catalog,
    load_user_file,
    with_user_gpus,
)
from atoll.solvers.models import DEFAULT_MODELS, get_model
from atoll.solvers.paths import PERF_FACTORS_PATH
from atoll.solvers.perf import RequestShape
from atoll.solvers.registry import UnknownNameError
from atoll.solvers.tables import catalog_document, perf_rows
from atoll.solvers.types import ModelSpec


def _catalog_and_models(user_file: Path | None) -> tuple[Catalog, list[ModelSpec]]:
    catalog = load_catalog()
    extra_models: list[ModelSpec] = []
    if user_file is not None:
        try:
            gpus, extra_models = load_user_file(user_file)
        except CatalogFileError as exc:
            raise UserError(str(exc)) from exc
        catalog = with_user_gpus(catalog, gpus)
    return catalog, extra_models


def cmd_catalog(args: argparse.Namespace) -> int:
    catalog, _ = _catalog_and_models(args.user_file)
    regions = args.regions.split(",") if args.regions else list(DEFAULT_REGIONS)
    try:
        doc = catalog_document(catalog, regions)
    except KeyError as exc:
        raise UserError(str(exc).strip("'\"")) from exc
    show_catalog(doc)
    if args.json:
        emit_json(doc)
    return 0


def show_catalog(doc: dict[str, Any]) -> None:
    """Render a catalog document (tables on stderr)."""
    gt = Table(title="GPU types", show_lines=False)
    for col in ("GPU", "memory GB", "HBM GB/s", "bf16 TFLOPS", "link GB/s"):
        gt.add_column(col, justify="right")
    for g in doc["gpus"]:
        gt.add_row(g["name"], f"{g['memory_gb']:g}", f"{g['hbm_bandwidth_gbs']:g}",
                   f"{g['bf16_tflops']:g}", f"{g['link_gbs']:g}")
    ot = Table(title="Offers ($/node-hour; * = spot estimated)")
    for col in ("region", "config", "instance", "on-demand", "spot"):
        ot.add_column(col)
    for o in doc["offers"]:
        spot = "-" if o["spot_per_hour"] is None else f"{o['spot_per_hour']:.3f}"
        ot.add_row(o["region"], o["config"], o["instance"], f"{o['on_demand_per_hour']:.3f}",
                   spot + ("*" if o["spot_estimated"] else ""))
    console.print(gt)
    console.print(ot)


def _models_arg(value: str | None, extra: list[ModelSpec]) -> list[ModelSpec]:
    names = value.split(",") if value else list(DEFAULT_MODELS)
    try:
        return [get_model(n, extra) for n in names]
    except UnknownNameError as exc:
        raise UserError(str(exc)) from exc


def cmd_perf_table(args: argparse.Namespace) -> int:
    catalog, extra = _catalog_and_models(args.user_file)
    models = _models_arg(args.model, extra)
    try:
        gpu_types = args.gpus.split(",") if args.gpus else list(DEFAULT_GPU_TYPES)
        configs = catalog.configs(gpu_types)
        shape = RequestShape(args.input_tokens, args.output_tokens)
    except (UnknownNameError, ValueError) as exc:
        raise UserError(str(exc)) from exc
    t0 = time.perf_counter()
    rows = perf_rows(models, configs, shape=shape)
    seconds = time.perf_counter() - t0
    show_perf(rows, shape, seconds)
    if args.json:
        emit_json({"rows": rows, "seconds": seconds,
                   "shape": {"input_tokens": shape.input_tokens,
                             "output_tokens": shape.output_tokens}})
    return 0


def show_perf(rows: list[dict[str, Any]], shape: RequestShape, seconds: float) -> None:
    """Render node-profile rows (table on stderr)."""
    table = Table(title=f"Node profiles (tokens/s within SLO; input {shape.input_tokens:g}, "
                        f"output {shape.output_tokens:g} tokens)")
    for col in ("model", "config", "max layers", "prefill tok/s", "decode tok/s"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["model"], r["config"], f"{r['max_layers']}/{r['layers']}",
                      f"{r['prefill_tokens_per_s']:.0f}", f"{r['decode_tokens_per_s']:.0f}")
    console.print(table)
    console.print(f"{len(rows)} profiles in {seconds * 1e3:.1f} ms")


def cmd_perf_calibrate(args: argparse.Namespace) -> int:
    from atoll.solvers.calibrate import calibrate, write_factors

    try:
        report = calibrate(args.data, seed=args.seed, progress=lambda m: console.log(m))
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from exc
    write_factors(report, args.out)
    table = Table(title="Held-out median absolute percentage error")
    table.add_column("dataset")
    table.add_column("GPU")
    table.add_column("MdAPE", justify="right")
    for ds, by_gpu in report["heldout_mape_by_gpu"].items():
        table.add_row(ds, "all", f"{report['heldout_mape'][ds]:.3f}")
        for gpu, v in by_gpu.items():
            table.add_row("", gpu, f"{v:.3f}")
    console.print(table)
    logo = Table(title="Leave-one-GPU-out MdAPE (predicted with a relative's factors)")
    logo.add_column("GPU")
    logo.add_column("relative")
    logo.add_column("MdAPE", justify="right")
    for gpu, v in report["leave_one_gpu_out_mape"].items():
        logo.add_row(gpu, report["leave_one_gpu_out_relative"][gpu], f"{v:.3f}")
    console.print(logo)
    console.print(f"wrote fitted factors to {args.out}")
    if args.json:
        emit_json({**report, "factors_path": str(args.out)})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="GPU types, node configs and prices per region")
    p.add_argument("--regions", help=f"comma-separated (default {','.join(DEFAULT_REGIONS)})")
    p.add_argument("--user-file", type=Path, help="YAML/TOML file adding GPU types and models")
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(handler=cmd_catalog)

    perf = sub.add_parser("perf", help="performance model: node profiles and calibration")
    psub = perf.add_subparsers(dest="perf_command", required=True, metavar="SUBCOMMAND")
    t = psub.add_parser("table", help="node profiles of models across node configs")
    t.add_argument("--model", help="model name(s), comma-separated (default: the six defaults)")
    t.add_argument("--gpus", help=f"GPU types (default {','.join(DEFAULT_GPU_TYPES)})")
    t.add_argument("--input-tokens", type=float, default=RequestShape().input_tokens)
    t.add_argument("--output-tokens", type=float, default=RequestShape().output_tokens)
    t.add_argument("--user-file", type=Path, help="YAML/TOML file adding GPU types and models")
    t.add_argument("--json", action="store_true")
    t.set_defaults(handler=cmd_perf_table)
    c = psub.add_parser("calibrate", help="fit efficiency factors to measured public profiles")
    c.add_argument("--data", type=Path, help="shared data folder (default ../shared/data)")
    c.add_argument("--out", type=Path, default=PERF_FACTORS_PATH)
    c.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    c.add_argument("--json", action="store_true")
    c.set_defaults(handler=cmd_perf_calibrate)
