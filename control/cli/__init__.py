"""The ``atoll`` command line: one thin module per command that parses its arguments, calls one
library function and renders the result (``atoll.control.cli.output`` says where output goes).

Every module has ``add_parser(subparsers)``; the chosen handler gets the parsed namespace and
returns an exit code. User errors (:class:`atoll.solvers.errors.AtollError`) are caught once,
here: the message goes to stderr (and, with ``--json``, an ``{"error": ...}`` document to
stdout) and the exit code is 2.

Start-up stays fast: :func:`main` imports only the module of the command it runs (the others
are listed from :data:`COMMANDS`, their names and one-line help), so ``atoll --help`` and the
light commands never load torch, MLflow, Ray or the simulator.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from atoll.solvers.errors import AtollError, InputError

# command -> (module under atoll.control.cli, one-line help), in the order `atoll --help` lists them
COMMANDS: dict[str, tuple[str, str]] = {
    "catalog": ("catalog", "GPU types, node configs and prices per region"),
    "models": ("models", "the models atoll knows (or a fleet file's), with their SLOs"),
    "check": ("check", "load a fleet file and every log it names; report what was read"),
    "perf": ("perf", "performance model: node profiles and calibration"),
    "demo": ("demo", "train, evaluate and compare a re-planning policy on the default data"),
    "templates": ("templates", "serving-template library (offline stage)"),
    "solve": ("solve", "allocate a scenario's demand with the ILP or a baseline"),
    "forecast": ("forecast", "demand forecasting: backtests and plots"),
    "simulate": ("simulate", "run re-planning policies through the fleet simulator"),
    "replay": ("replay", "serve vLLM-style /metrics per model from demand traces"),
    "train": ("train", "train a PPO re-planning trigger on FleetEnv (logged to MLflow)"),
    "evaluate": ("evaluate", "compare policies on held-out days (MLflow parent + nested runs)"),
    "tune": ("tune", "choose the rule a fleet should run on its own history; write it as a policy file"),
    "control": ("control", "run the live controller: metrics in, plans out"),
}


class _Parser(argparse.ArgumentParser):
    """argparse whose errors reach main's one error path (so ``--json`` gets its error document)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise InputError(f"{self.prog}: {message}")


def version() -> str:
    """The installed package's version."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("atoll")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser(only: str | None = "*") -> argparse.ArgumentParser:
    """The ``atoll`` parser. ``only``: ``"*"`` builds every command's parser (tests, docs);
    a command's name builds that one and lists the others by name; None lists them all by name
    (``atoll --help``)."""
    parser = _Parser(prog="atoll", description="Plan and run a multi-LLM fleet on heterogeneous GPUs.")
    parser.add_argument("--version", action="version", version=f"atoll {version()}",
                        help="print atoll's version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, help_) in COMMANDS.items():
        if only == "*" or only == name:
            importlib.import_module(f"atoll.control.cli.{module}").add_parser(sub)
        else:
            sub.add_parser(name, help=help_, add_help=False)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    json_mode = "--json" in argv
    name = _command(argv)
    guard: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if json_mode:
        from atoll.control.cli.output import native_stdout_to_stderr

        guard = native_stdout_to_stderr()
    with guard:
        try:
            args = build_parser(name if name in COMMANDS else None).parse_args(argv)
            args.argv = tuple(argv)  # the command as given: recorded where a result names how it was made
            json_mode = bool(getattr(args, "json", False))
            return int(args.handler(args) or 0)
        except AtollError as exc:
            from atoll.control.cli.output import report_error

            report_error(exc, json_mode)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
