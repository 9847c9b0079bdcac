"""``atoll perf table`` and ``atoll perf calibrate``: node profiles and the fitted efficiency factors."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from atoll.control.cli.catalog import catalog_and_models
from atoll.control.cli.common import add_json
from atoll.control.cli.output import UserError, as_user_error, output_for
from atoll.solvers.catalog import DEFAULT_GPU_TYPES
from atoll.solvers.models import DEFAULT_MODELS, get_model
from atoll.solvers.paths import ENV_CACHE_DIR
from atoll.solvers.perf import RequestShape, load_factors
from atoll.solvers.tables import perf_rows
from atoll.solvers.types import ModelSpec


def _models_arg(value: str | None, extra: list[ModelSpec]) -> list[ModelSpec]:
    names = value.split(",") if value else list(DEFAULT_MODELS)
    return [get_model(n, extra) for n in names]


def cmd_perf_table(args: argparse.Namespace) -> int:
    out = output_for(args)
    if args.fleet:
        from atoll.control.cli.catalog import fleet_catalog

        if args.user_file:
            raise UserError("--fleet names its own models and GPU types; drop --user-file")
        catalog, spec = fleet_catalog(args.fleet)
        extra = list(spec.user_models)
        models = _models_arg(args.model, extra) if args.model else list(spec.models)
        gpu_types = args.gpus.split(",") if args.gpus else list(spec.gpu_types)
        offered = {o.config for o in spec.offers}
        configs = [c for c in catalog.configs(gpu_types) if c.name in offered]
    else:
        catalog, extra = catalog_and_models(args.user_file)
        models = _models_arg(args.model, extra)
        gpu_types = args.gpus.split(",") if args.gpus else list(DEFAULT_GPU_TYPES)
        configs = catalog.configs(gpu_types)
    shape = RequestShape(args.input_tokens, args.output_tokens)
    t0 = time.perf_counter()
    rows = perf_rows(models, configs, shape=shape)
    seconds = time.perf_counter() - t0
    out.result(perf_table(rows, shape))
    if any(r["unvalidated"] for r in rows):
        from atoll.solvers.perf import UNVALIDATED_NOTE

        out.note(f"† {UNVALIDATED_NOTE}")
    out.note(f"{len(rows)} profiles in {seconds * 1e3:.1f} ms")
    factors = load_factors()
    borrowed = [g for g in dict.fromkeys(c.gpu.name for c in configs) if factors.borrowed(g)]
    if borrowed:
        out.note(f"{', '.join(borrowed)}: no fitted efficiency factors (no public profile, no sibling); "
                 f"borrowing the median of the fitted GPUs' (compute {factors.compute_eff(borrowed[0]):.2f}, "
                 f"memory {factors.memory_eff(borrowed[0]):.2f}) — treat these profiles as rough")
    out.json({"rows": rows, "seconds": seconds, "borrowed_factors": borrowed,
              "shape": {"input_tokens": shape.input_tokens, "output_tokens": shape.output_tokens}})
    return 0


def perf_table(rows: list[dict[str, Any]], shape: RequestShape) -> Table:
    table = Table(title=f"Node profiles (tokens/s within SLO; input {shape.input_tokens:g}, "
                        f"output {shape.output_tokens:g} tokens)")
    for col in ("model", "config", "max layers", "prefill tok/s", "decode tok/s"):
        table.add_column(col, justify="right")
    for r in rows:
        mark = "†" if r.get("unvalidated") else ""
        table.add_row(r["model"], r["config"], f"{r['max_layers']}/{r['layers']}",
                      f"{r['prefill_tokens_per_s']:.0f}{mark}", f"{r['decode_tokens_per_s']:.0f}{mark}")
    return table


def cmd_perf_calibrate(args: argparse.Namespace) -> int:
    from atoll.solvers.calibrate import calibrate, write_factors

    out = output_for(args)
    try:
        report = calibrate(args.data, seed=args.seed, progress=out.note)
    except FileNotFoundError as exc:
        raise as_user_error(exc) from exc
    path = write_factors(report, args.out)  # default: the user's file under the cache folder
    table = Table(title="Held-out median absolute percentage error")
    table.add_column("dataset")
    table.add_column("GPU")
    table.add_column("MdAPE", justify="right")
    for ds, by_gpu in report["heldout_mape_by_gpu"].items():
        table.add_row(ds, "all", f"{report['heldout_mape'][ds]:.3f}")
        for gpu, v in by_gpu.items():
            table.add_row("", gpu, f"{v:.3f}")
    out.result(table)
    logo = Table(title="Leave-one-GPU-out MdAPE (predicted with a relative's factors)")
    logo.add_column("GPU")
    logo.add_column("relative")
    logo.add_column("MdAPE", justify="right")
    for gpu, v in report["leave_one_gpu_out_mape"].items():
        logo.add_row(gpu, report["leave_one_gpu_out_relative"][gpu], f"{v:.3f}")
    out.result(logo)
    reads = ("" if args.out else
             "; the performance model reads them from now on (delete the file for the package's)")
    out.note(f"wrote fitted factors to {path}{reads}")
    out.json({**report, "factors_path": str(path)})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    perf = sub.add_parser("perf", help="performance model: node profiles and calibration")
    psub = perf.add_subparsers(dest="perf_command", required=True, metavar="SUBCOMMAND")
    t = psub.add_parser("table", help="node profiles of models across node configs")
    t.add_argument("--model", help="model name(s), comma-separated (default: the six defaults; with --fleet: "
                                   "the fleet's)")
    t.add_argument("--gpus", help=f"GPU types (default {','.join(DEFAULT_GPU_TYPES)}; with --fleet: the "
                                  f"fleet's, its offered configs only)")
    t.add_argument("--fleet", default=None, metavar="FILE",
                   help="profile a fleet file's models on its offered node configs (or core, extended)")
    t.add_argument("--input-tokens", type=float, default=RequestShape().input_tokens,
                   help=f"mean input tokens per request (default {RequestShape().input_tokens:g})")
    t.add_argument("--output-tokens", type=float, default=RequestShape().output_tokens,
                   help=f"mean output tokens per request (default {RequestShape().output_tokens:g})")
    t.add_argument("--user-file", type=Path, help="YAML/TOML file adding GPU types and models")
    add_json(t)
    t.set_defaults(handler=cmd_perf_table)
    c = psub.add_parser("calibrate", help="fit efficiency factors to measured public profiles")
    c.add_argument("--data", type=Path, help="shared data folder (default ../shared/data)")
    c.add_argument("--out", type=Path, default=None,
                   help=f"where the fitted factors are written (default: perf_factors.json in "
                        f"${ENV_CACHE_DIR} or the user cache folder, which the performance model then reads)")
    c.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    add_json(c)
    c.set_defaults(handler=cmd_perf_calibrate)
