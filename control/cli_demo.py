"""``atoll demo``: the main job on the bundled default data.

Today it shows the foundation: the GPU/price catalog of the default regions and the node
profiles of the six default models over the 20 default node configs. Later stages (templates,
allocation, simulation, training) extend it.
"""

from __future__ import annotations

import argparse
import time

from control.cli_catalog import show_catalog, show_perf
from control.output import emit_json
from solvers.catalog import DEFAULT_GPU_TYPES, load_catalog
from solvers.models import DEFAULT_MODELS, get_model
from solvers.perf import RequestShape
from solvers.tables import catalog_document, perf_rows


def cmd_demo(args: argparse.Namespace) -> int:
    catalog = load_catalog()
    shape = RequestShape(args.input_tokens, args.output_tokens)
    doc = catalog_document(catalog)
    t0 = time.perf_counter()
    rows = perf_rows([get_model(m) for m in DEFAULT_MODELS], catalog.configs(DEFAULT_GPU_TYPES),
                     shape=shape)
    show_catalog(doc)
    show_perf(rows, shape, time.perf_counter() - t0)
    if args.json:
        emit_json({"catalog": doc, "perf_table": rows})
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job on the bundled default data")
    p.add_argument("--input-tokens", type=float, default=1024.0)
    p.add_argument("--output-tokens", type=float, default=256.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_demo)
