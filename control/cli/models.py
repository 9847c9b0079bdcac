"""``atoll models``: the models atoll knows (or a fleet file's), with their architecture and SLOs."""

from __future__ import annotations

import argparse
from typing import Any

from rich.table import Table

from atoll.control.cli.common import add_json
from atoll.control.cli.output import output_for


def models_document(fleet: str | None) -> dict[str, Any]:
    """Every catalog model (serving ones, then those the calibration profiles were measured on),
    or with ``fleet`` the fleet file's models, their own definitions included."""
    from atoll.solvers.models import _MODELS, get_model

    if fleet:
        from atoll.solvers.fleet import load_fleet

        spec = load_fleet(fleet)
        specs = list(spec.models)
        own = {m.name for m in spec.user_models}
    else:
        specs = [get_model(m.name) for m in _MODELS]
        own = set()
    rows = [{"name": m.name, "role": "fleet file" if m.name in own else m.role, "params_b": m.params_b,
             "active_params_b": m.active_params_b, "layers": m.layers, "bytes_per_param": m.bytes_per_param,
             "ttft_ms": m.slo.ttft_ms, "tpot_ms": m.slo.tpot_ms, "aliases": list(m.aliases)} for m in specs]
    return {"fleet": fleet, "models": rows}


def cmd_models(args: argparse.Namespace) -> int:
    out = output_for(args)
    doc = models_document(args.fleet)
    table = Table(title=f"Models of {args.fleet}" if args.fleet else "Models (serving, then calibration)")
    for col in ("model", "role", "params B", "active B", "layers", "bytes/param", "TTFT ms", "TPOT ms",
                "aliases"):
        table.add_column(col, justify="left" if col in ("model", "role", "aliases") else "right")
    for m in doc["models"]:
        table.add_row(m["name"], m["role"], f"{m['params_b']:g}", f"{m['active_params_b']:g}",
                      str(m["layers"]), f"{m['bytes_per_param']:g}", f"{m['ttft_ms']:g}", f"{m['tpot_ms']:g}",
                      ", ".join(m["aliases"]))
    out.result(table)
    out.json(doc)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("models", help="the models atoll knows (or a fleet file's), with their SLOs")
    p.add_argument("--fleet", default=None, metavar="FILE",
                   help="list this fleet file's models (or a bundled fleet's: core, extended)")
    add_json(p)
    p.set_defaults(handler=cmd_models)
