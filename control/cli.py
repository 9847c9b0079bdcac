"""The ``atoll`` command line: parses arguments and calls library functions, nothing more.

Each command group registers its sub-parser from a ``control/cli_<group>.py`` module with an
``add_parser(subparsers)`` function; the chosen handler gets the parsed namespace and returns an
exit code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from atoll.control import (
    cli_catalog,
    cli_control,
    cli_demo,
    cli_forecast,
    cli_replay,
    cli_simulate,
    cli_solve,
    cli_templates,
    cli_train,
)
from atoll.control.output import UserError, console

# Modules that contribute sub-commands; each has add_parser(subparsers).
_GROUPS: list[Callable[[argparse._SubParsersAction], None]] = [
    cli_catalog.add_parser,
    cli_demo.add_parser,
    cli_templates.add_parser,
    cli_solve.add_parser,
    cli_forecast.add_parser,
    cli_simulate.add_parser,
    cli_replay.add_parser,
    cli_train.add_parser,
    cli_control.add_parser,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="atoll",
        description="Plan and run a multi-LLM fleet on heterogeneous GPUs.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _GROUPS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(handler(args) or 0)
    except UserError as exc:
        console.print(f"[bold red]error:[/] {exc}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted")
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
