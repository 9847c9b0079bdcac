"""The ``atoll`` command line: one thin module per command that parses its arguments, calls one
library function and renders the result (``atoll.control.cli.output`` says where output goes).

Every module has ``add_parser(subparsers)``; the chosen handler gets the parsed namespace and
returns an exit code. User errors (:class:`atoll.solvers.errors.AtollError`) are caught once,
here: the message goes to stderr (and, with ``--json``, an ``{"error": ...}`` document to
stdout) and the exit code is 2.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from atoll.control.cli import (
    catalog,
    check,
    control,
    demo,
    evaluate,
    forecast,
    perf,
    replay,
    simulate,
    solve,
    templates,
    train,
)
from atoll.control.cli.output import console, native_stdout_to_stderr, report_error
from atoll.solvers.errors import AtollError, InputError

# Modules that contribute sub-commands, in the order `atoll --help` lists them.
_GROUPS: list[Callable[[argparse._SubParsersAction], None]] = [
    catalog.add_parser,
    check.add_parser,
    perf.add_parser,
    demo.add_parser,
    templates.add_parser,
    solve.add_parser,
    forecast.add_parser,
    simulate.add_parser,
    replay.add_parser,
    train.add_parser,
    evaluate.add_parser,
    control.add_parser,
]


class _Parser(argparse.ArgumentParser):
    """argparse whose errors reach main's one error path (so ``--json`` gets its error document)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise InputError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="atoll", description="Plan and run a multi-LLM fleet on heterogeneous GPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in _GROUPS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in argv
    guard = native_stdout_to_stderr() if json_mode else contextlib.nullcontext()
    with guard:
        try:
            args = build_parser().parse_args(argv)
            json_mode = bool(getattr(args, "json", False))
            return int(args.handler(args) or 0)
        except AtollError as exc:
            report_error(exc, json_mode)
            return 2
        except KeyboardInterrupt:
            console.print("interrupted")
            return 130
