"""``atoll demo``: the main job on the bundled default data.

Today it shows the foundation: the GPU/price catalog of the default regions and the node
profiles of the six default models over the 20 default node configs. Later stages (templates,
allocation, simulation, training) extend it.
"""

from __future__ import annotations

import argparse

from control import cli_catalog


def cmd_demo(args: argparse.Namespace) -> int:
    json_out = args.json
    # One JSON document: the demo's sections are gathered, not printed one by one.
    cat_args = argparse.Namespace(regions=None, user_file=None, json=False)
    perf_args = argparse.Namespace(model=None, gpus=None, user_file=None, json=False,
                                   input_tokens=args.input_tokens, output_tokens=args.output_tokens)
    cli_catalog.cmd_catalog(cat_args)
    cli_catalog.cmd_perf_table(perf_args)
    if json_out:
        from control.output import emit_json
        from solvers.catalog import DEFAULT_GPU_TYPES, load_catalog
        from solvers.models import DEFAULT_MODELS, get_model
        from solvers.perf import RequestShape
        from solvers.tables import catalog_document, perf_rows

        catalog = load_catalog()
        shape = RequestShape(args.input_tokens, args.output_tokens)
        emit_json({
            "catalog": catalog_document(catalog),
            "perf_table": perf_rows([get_model(m) for m in DEFAULT_MODELS],
                                    catalog.configs(DEFAULT_GPU_TYPES), shape=shape),
        })
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the main job on the bundled default data")
    p.add_argument("--input-tokens", type=float, default=1024.0)
    p.add_argument("--output-tokens", type=float, default=256.0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_demo)
