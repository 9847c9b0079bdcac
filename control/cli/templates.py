"""``atoll templates build``: build (or load from cache) the serving-template library."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from atoll.control.cli.common import add_fleet_option, add_json, add_pd_option, read_fleet_arg
from atoll.control.cli.output import UserError, as_user_error, console, output_for, progress
from atoll.solvers.catalog import DEFAULT_GPU_TYPES, DEFAULT_REGIONS
from atoll.solvers.models import DEFAULT_MODELS
from atoll.solvers.perf import RequestShape
from atoll.solvers.runtime import DEFAULT_RUNTIME, RUNTIMES, slices_default
from atoll.solvers.scenarios import SCENARIOS, library_spec
from atoll.solvers.templates import LibrarySpec, TemplateLibrary, build_library


def _split(value: str | None) -> tuple[str, ...] | None:
    return tuple(v.strip() for v in value.split(",") if v.strip()) if value else None


def _scenario_library(name: str) -> LibrarySpec:
    """A bundled scenario's library spec with its per-model request shapes (Azure trace means), so
    that this command warms the same cache entries the allocation will read; without the traces,
    the default request shape (said on stderr)."""
    scenario = SCENARIOS[name]  # an unknown name lists the valid ones
    try:
        return library_spec(scenario)
    except FileNotFoundError as exc:
        console.print(f"[yellow]note:[/] {exc}; using the default request shape")
        return LibrarySpec(models=scenario.models, regions=scenario.regions, gpu_types=scenario.gpu_types,
                           n_max=scenario.n_max, rho=scenario.rho)


def spec_from_args(args: argparse.Namespace) -> tuple[str | None, LibrarySpec]:
    """The library spec: a scenario's (if given) with any explicit option overriding it."""
    shape = None
    if args.input_tokens is not None or args.output_tokens is not None:
        default = RequestShape()
        try:
            shape = RequestShape(default.input_tokens if args.input_tokens is None else args.input_tokens,
                                 default.output_tokens if args.output_tokens is None else args.output_tokens)
        except ValueError as exc:
            raise as_user_error(exc) from exc
    active = read_fleet_arg(args)
    own: tuple[str | None, bool] = (None, False)  # the fleet's runtime and slices
    if active is not None or args.scenario is not None:
        base = library_spec(active.scenario) if active is not None else _scenario_library(args.scenario)
        if active is not None:
            own = (base.runtime, base.slices)
        fields: dict[str, Any] = {"models": base.models, "regions": base.regions, "gpu_types": base.gpu_types,
                                  "n_max": base.n_max, "rho": base.rho, "shape": base.shape,
                                  "model_shapes": () if shape else base.model_shapes, "runtime": base.runtime,
                                  "fleet": base.fleet, "pd": base.pd, "model_pd": base.model_pd}
    else:
        fields = {"models": DEFAULT_MODELS, "regions": DEFAULT_REGIONS, "gpu_types": DEFAULT_GPU_TYPES}
    for arg, name in (("models", "models"), ("regions", "regions"), ("gpus", "gpu_types")):
        if (value := _split(getattr(args, arg))) is not None:
            fields[name] = value
    if args.n_max is not None:
        fields["n_max"] = args.n_max
    if args.rho is not None:
        fields["rho"] = args.rho
    if shape is not None:
        fields["shape"] = shape
    if args.runtime is not None:
        fields["runtime"] = args.runtime
    if args.pd is not None:
        fields["pd"], fields["model_pd"] = args.pd, ()
    # LibrarySpec refuses slices without runtime vllm, naming the field
    fields["slices"] = args.slices if args.slices is not None else slices_default(
        fields.get("runtime", DEFAULT_RUNTIME), *own)
    kept = set(fields["models"])
    fields["model_shapes"] = tuple((m, s) for m, s in fields.get("model_shapes", ()) if m in kept)
    fields["model_pd"] = tuple((m, v) for m, v in fields.get("model_pd", ()) if m in kept)
    try:
        return args.scenario, LibrarySpec(**fields)
    except (ValueError, TypeError, KeyError) as exc:
        raise as_user_error(exc) from exc


def library_document(scenario: str | None, lib: TemplateLibrary) -> dict[str, Any]:
    return {"scenario": scenario, "templates_per_service": lib.counts(),
            "total_templates": len(lib.templates),
            "build_seconds": lib.build_seconds, "from_cache": lib.from_cache, "cache_key": lib.key,
            "spec": lib.spec.to_json()}


def cmd_templates_build(args: argparse.Namespace) -> int:
    out = output_for(args)
    scenario, spec = spec_from_args(args)
    if args.workers is not None and args.workers < 1:
        raise UserError(f"--workers must be >= 1, got {args.workers}")
    try:
        with progress("templates (multisets placed)", None) as advance:
            lib = build_library(spec, cache_dir=args.cache_dir, workers=args.workers,
                                ray_address=args.ray, use_cache=not args.no_cache,
                                progress=lambda n, total: advance(n, total=total))
    except RuntimeError as exc:  # e.g. --ray without the optional extra
        raise as_user_error(exc) from exc
    table = Table(title=f"Template library ({scenario or 'custom'}; "
                        f"{'loaded from cache' if lib.from_cache else 'built'} in {lib.build_seconds:.1f} s)")
    for col in ("service", "templates", "best tokens/s", "max nodes"):
        table.add_column(col, justify="right")
    for service, n in lib.counts().items():
        model, _, phase = service.rpartition("/")
        ts = [t for t in lib.for_model(model) if t.service.phase.value == phase]
        table.add_row(service, str(n), f"{max((t.throughput for t in ts), default=0.0):.0f}",
                      str(max((t.node_count for t in ts), default=0)))
    out.result(table)
    out.note(f"{len(lib.templates)} templates; cache key {lib.key[:16]}")
    out.json(library_document(scenario, lib))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("templates", help="serving-template library (offline stage)")
    psub = p.add_subparsers(dest="templates_command", required=True, metavar="SUBCOMMAND")
    b = psub.add_parser("build", help="enumerate, place exactly and prune templates; cached on disk")
    b.add_argument("--scenario", help=f"library of a scenario: {', '.join(SCENARIOS)} "
                                      "(options below override its fields)")
    add_fleet_option(b)
    b.add_argument("--runtime", default=None, choices=RUNTIMES,
                   help="keep what this serving runtime can run: vllm or any (default: any; a fleet's own)")
    b.add_argument("--slices", action=argparse.BooleanOptionalAction, default=None,
                   help="under runtime vllm (default there: slices): stages may also use g of a node's G "
                        "GPUs; --no-slices: whole nodes only")
    add_pd_option(b)
    b.add_argument("--models", help="comma-separated model names (default: the six defaults)")
    b.add_argument("--regions", help=f"comma-separated (default {','.join(DEFAULT_REGIONS)})")
    b.add_argument("--gpus", help=f"GPU types (default {','.join(DEFAULT_GPU_TYPES)})")
    b.add_argument("--n-max", type=int, help="most nodes per template (default 6)")
    b.add_argument("--rho", type=float, help="memory cap: templates hold < rho x model weights (default 12)")
    b.add_argument("--input-tokens", type=float, help="mean prompt tokens (default 1024, or per scenario)")
    b.add_argument("--output-tokens", type=float, help="mean generated tokens (default 256, or per scenario)")
    b.add_argument("--workers", type=int, help="local worker processes (default: CPU count)")
    b.add_argument("--ray", metavar="ADDRESS", help="run on a Ray cluster (needs the atoll[ray] extra)")
    b.add_argument("--cache-dir", type=Path, help="cache folder (default $ATOLL_CACHE_DIR/templates or "
                                                   "<repo>/cache/templates)")
    b.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    add_json(b)
    b.set_defaults(handler=cmd_templates_build)
