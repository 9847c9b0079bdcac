"""``atoll catalog``: GPU types, node configs and prices per region."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from atoll.control.cli.common import add_json
from atoll.control.cli.output import UserError, output_for
from atoll.solvers.catalog import (
    DEFAULT_REGIONS,
    Catalog,
    load_catalog,
    load_user_file,
    with_user_gpus,
)
from atoll.solvers.fleet import FleetSpec
from atoll.solvers.tables import catalog_document
from atoll.solvers.types import ModelSpec


def catalog_and_models(user_file: Path | None, override: bool = False) -> tuple[Catalog, list[ModelSpec]]:
    """The bundled catalog, with the GPU types and models of ``--user-file`` added (a GPU type
    named like a built-in one only with ``override``)."""
    catalog = load_catalog()
    extra_models: list[ModelSpec] = []
    if user_file is not None:
        gpus, extra_models = load_user_file(user_file)  # raises CatalogFileError, an InputError
        catalog = with_user_gpus(catalog, gpus, override=override)
    return catalog, extra_models


def fleet_catalog(fleet: str) -> tuple[Catalog, FleetSpec]:
    """The catalog as a fleet file sees it (its GPU types and own offers overlaid) and its spec."""
    from atoll.solvers.catalog import fleet_catalog as overlaid
    from atoll.solvers.fleet import load_fleet

    spec = load_fleet(fleet)
    return overlaid(spec.gpus, spec.offers), spec


def cmd_catalog(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.fleet:
        if args.user_file or args.override_gpus:
            raise UserError("--fleet names its own GPU types and offers; drop --user-file and "
                            "--override-gpus (add GPU types under the fleet file's gpus)")
        catalog, spec = fleet_catalog(args.fleet)
        regions = args.regions.split(",") if args.regions else list(spec.regions)
        doc = catalog_document(catalog, regions)
        cells = {(o.region, o.config) for o in spec.offers}
        doc["offers"] = [{**o, "market": spec.market_of((o["region"], o["config"]))} for o in doc["offers"]
                         if (o["region"], o["config"]) in cells]
        doc["fleet"] = args.fleet
    else:
        catalog, _ = catalog_and_models(args.user_file, args.override_gpus)
        regions = args.regions.split(",") if args.regions else list(DEFAULT_REGIONS)
        doc = catalog_document(catalog, regions)
    for table in catalog_tables(doc):
        out.result(table)
    out.json(doc)
    return 0


def catalog_tables(doc: dict[str, Any]) -> list[Table]:
    gt = Table(title="GPU types", show_lines=False)
    for col in ("GPU", "memory GB", "HBM GB/s", "bf16 TFLOPS", "link GB/s"):
        gt.add_column(col, justify="right")
    for g in doc["gpus"]:
        gt.add_row(g["name"], f"{g['memory_gb']:g}", f"{g['hbm_bandwidth_gbs']:g}",
                   f"{g['bf16_tflops']:g}", f"{g['link_gbs']:g}")
    ot = Table(title="Offers ($/node-hour; * = spot estimated)")
    markets = any("market" in o for o in doc["offers"])
    for col in ("region", "config", "instance", "on-demand", "spot", *(("market",) if markets else ())):
        ot.add_column(col)
    for o in doc["offers"]:
        spot = "-" if o["spot_per_hour"] is None else f"{o['spot_per_hour']:.3f}"
        ot.add_row(o["region"], o["config"], o["instance"], f"{o['on_demand_per_hour']:.3f}",
                   spot + ("*" if o["spot_estimated"] else ""), *((o["market"],) if markets else ()))
    return [gt, ot]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("catalog", help="GPU types, node configs and prices per region")
    p.add_argument("--regions", help=f"comma-separated (default {','.join(DEFAULT_REGIONS)}; with --fleet: "
                                     f"the fleet's)")
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="show a fleet file's GPU types and offers, with each pool's market (or a bundled "
                        "fleet: core, extended)")
    p.add_argument("--user-file", type=Path, help="YAML/TOML file adding GPU types and models")
    p.add_argument("--override-gpus", action="store_true",
                   help="let --user-file GPU types replace built-in ones of the same name")
    add_json(p)
    p.set_defaults(handler=cmd_catalog)
